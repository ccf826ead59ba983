#!/bin/bash
cat > /app/server.ini <<'EOF'
[server]
port = 8089
token = s3cret
EOF

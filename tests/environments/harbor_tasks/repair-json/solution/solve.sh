#!/bin/bash
cat > /app/config.json <<'EOF'
{"name": "demo", "port": 8080, "debug": false}
EOF

#!/bin/bash
python3 - <<'EOF'
import collections, json
counts = collections.Counter(
    line.split()[2] for line in open("/app/app.log") if line.split()[1] == "ERROR"
)
json.dump(dict(counts), open("/app/errors.json", "w"))
EOF

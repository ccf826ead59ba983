#!/bin/bash
# reward.json: 1.0 when errors.json has the right counts.
python3 - <<'EOF'
import json
try:
    ok = json.load(open("/app/errors.json")) == {"api": 3, "db": 1, "cache": 1}
except Exception:
    ok = False
json.dump({"reward": float(ok)}, open("/logs/verifier/reward.json", "w"))
EOF

#!/bin/bash
# Writes {"reward": 1.0} to /logs/verifier/reward.json when fib.py is right.
cd /app && python3 - <<'EOF'
import json
try:
    from fib import fib
    ok = [fib(n) for n in (0, 1, 2, 10, 30)] == [0, 1, 1, 55, 832040] and fib(90) == 2880067194370816120
except Exception:
    ok = False
json.dump({"reward": 1.0 if ok else 0.0}, open("/logs/verifier/reward.json", "w"))
EOF

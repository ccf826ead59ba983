#!/bin/bash
# Writes 1 to /logs/verifier/reward.txt when the task is done, else 0.
if python3 -c 'import json; c = json.load(open("/app/config.json")); assert c == {"name": "demo", "port": 8080, "debug": False}' 2>/dev/null; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

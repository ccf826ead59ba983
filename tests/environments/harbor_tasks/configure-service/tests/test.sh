#!/bin/bash
# Starts the service with the agent's configuration and asks for /health with the token.
python3 /app/server.py & pid=$!
reward=0
for _ in $(seq 50); do
  if python3 -c 'import urllib.request as u; r = u.urlopen(u.Request("http://127.0.0.1:8089/health", headers={"X-Token": "s3cret"}), timeout=1); assert r.read() == b"ok"' 2>/dev/null; then reward=1; break; fi
  sleep 0.1
done
kill $pid 2>/dev/null
echo $reward > /logs/verifier/reward.txt

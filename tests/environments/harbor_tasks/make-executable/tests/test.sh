#!/bin/bash
# Writes 1 to /logs/verifier/reward.txt when the task is done, else 0.
if [ -x /app/run.sh ] && [ "$(cat /app/ran.txt 2>/dev/null)" = ran ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

#!/bin/bash
rm -rf /app/backup
# Writes 1 to /logs/verifier/reward.txt when the task is done, else 0.
if bash /app/backup.sh >/dev/null 2>&1 && [ "$(cat /app/backup/a.txt)" = alpha ] && [ "$(cat /app/backup/b.txt)" = beta ] && [ "$(sort /app/backup/MANIFEST | tr '\n' ' ')" = "a.txt b.txt " ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

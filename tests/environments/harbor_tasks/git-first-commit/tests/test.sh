#!/bin/bash
# Writes 1 to /logs/verifier/reward.txt when the task is done, else 0.
if [ "$(git -C /app/project log --format=%s 2>/dev/null)" = "initial commit" ] && [ "$(git -C /app/project show HEAD:README.md 2>/dev/null)" = "# Project" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

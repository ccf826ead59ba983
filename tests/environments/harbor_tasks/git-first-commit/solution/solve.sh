#!/bin/bash
cd /app/project
git init -q
echo '# Project' > README.md
git add README.md
git -c user.name=oracle -c user.email=oracle@localhost commit -qm 'initial commit'

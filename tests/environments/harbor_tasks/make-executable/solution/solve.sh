#!/bin/bash
chmod +x /app/run.sh
/app/run.sh

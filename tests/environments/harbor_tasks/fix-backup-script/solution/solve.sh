#!/bin/bash
sed -i 's/SRC_DRI/SRC_DIR/' /app/backup.sh

#!/bin/bash
# Copies every .txt file of /app/data into /app/backup and lists them in /app/backup/MANIFEST.
set -e
SRC_DIR=/app/data
DEST_DIR=/app/backup
mkdir -p "$DEST_DIR"
for f in "$SRC_DRI"/*.txt; do
  cp "$f" "$DEST_DIR/"
  basename "$f" >> "$DEST_DIR/MANIFEST"
done

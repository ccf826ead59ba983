#!/bin/bash
tr ' ' '\n' < /app/words.txt | grep -v '^$' | sort -u > /app/sorted.txt

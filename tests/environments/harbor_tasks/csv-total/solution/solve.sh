#!/bin/bash
awk -F, '$1 == "north" {s += $2} END {print s}' /app/sales.csv > /app/north_total.txt

#!/bin/sh
echo ran > /app/ran.txt

"""Benchmarks: each prints its figures as a table and writes them to a JSON file."""

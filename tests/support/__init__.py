"""Test helpers: real services as subprocesses on free loopback ports."""

"""The ``rollout`` command line."""

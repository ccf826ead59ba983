"""Deployment files as data: render the Kubernetes overlays and Compose, validate every object,
and check that every variable they set reaches a real setting (``rollout deploy check``)."""

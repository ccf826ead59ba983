"""The whole platform on one machine: ``rollout up`` starts every service as a real process
and runs a training job against them. An orchestrator, so it may import every service."""

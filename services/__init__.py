"""Rollout-as-a-service platform: the shared contract, the services and the CLI."""

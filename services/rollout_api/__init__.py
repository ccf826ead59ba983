"""The rollout API (HTTP front door, stateless: every fact lives in Redis) and the rollout
workers that run agent episodes (``worker/``)."""

"""Rollout workers: take work items from the jobs' streams (weighted fair share), run each as a
token-in-token-out bash-agent episode against the LLM proxy and a broker sandbox, and publish
the trajectory to the job's stream."""

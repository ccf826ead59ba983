"""The agent gateway: per-episode OpenAI/Anthropic-compatible sessions that record token ids and
logprobs (see ``service.py`` for the routes, ``docs/agents.md`` for the user's view)."""

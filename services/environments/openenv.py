"""OpenEnv environments (the ``openenv-core`` package): servers with ``reset`` / ``step``, named by URL.

- ``tasks_for``: platform tasks with an ``env`` agent of source ``openenv`` whose ``env`` is the
  server's base URL (``http://host:port``); ``config`` says how text maps onto the environment's
  typed action and observation (``action_key``, ``observation_key``) and what ``reset`` gets.
- ``open_environment``: called by the worker through ``ENV_ADAPTERS``: the package's own
  ``GenericEnvClient`` (one WebSocket session per episode at ``URL/ws``, as OpenEnv's clients do:
  its HTTP ``/reset`` and ``/step`` make a fresh environment per request). The reset observation
  becomes a user message; each reply is sent as ``{action_key: reply}``; each step's observation
  becomes the next user message, its reward and done are honoured.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

from services.protocol import RewardSpec, Task
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_REWARD_COMMAND, EnvStep

SOURCE = "openenv"
PACKAGE = "openenv-core"
RESERVED = ("done", "reward", "metadata")  # an observation's fields that are not its content


def package_version() -> str:
    return f"{PACKAGE} {importlib.metadata.version(PACKAGE)}"


def tasks_for(url: str, prompts: dict[str, str], *, action_key: str = "message", observation_key: str | None = None,
              reset: dict[str, dict[str, Any]] | None = None, source_version: str = "") -> list[Task]:  # fmt: skip
    """One task per ``prompts`` entry (task id -> prompt), each against the server at ``url``;
    ``reset[task_id]`` are that task's ``reset`` arguments (a seed, a target, ...)."""
    if not url.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"an OpenEnv server is named by its URL (http://host:port), not {url!r}")
    tasks = []
    for task_id, prompt in prompts.items():
        config = {"action_key": action_key, "observation_key": observation_key, "reset": (reset or {}).get(task_id, {})}
        agent = EnvAgent(source=SOURCE, env=url, config=config)
        tasks.append(Task(id=task_id, prompt=prompt, agent=agent, source=SOURCE,
                          source_version=source_version or package_version(),
                          reward=RewardSpec(command=ENV_REWARD_COMMAND, parse_float=True)))  # fmt: skip
    return tasks


def observation_text(observation: dict[str, Any], key: str | None) -> str:
    """The observation's text: its ``key`` field; else its one string field; else its fields as JSON."""
    if key is not None:
        return str(observation.get(key, ""))
    fields = {k: v for k, v in observation.items() if k not in RESERVED}
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(fields, sort_keys=True) if fields else ""


class OpenEnvEnvironment:
    """An OpenEnv server's session behind ``SteppedEnvironment``."""

    def __init__(self, spec: EnvAgent) -> None:
        from openenv.core.generic_client import GenericEnvClient  # needed only where these environments run

        self.client = GenericEnvClient(base_url=spec.env)
        self.action_key = str(spec.config.get("action_key") or "message")
        self.observation_key = spec.config.get("observation_key")
        self.reset_args = dict(spec.config.get("reset") or {})

    async def reset(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        await self.client.connect()
        result = await self.client.reset(**self.reset_args)
        text = observation_text(result.observation, self.observation_key)
        return [*messages, {"role": "user", "content": text}] if text else messages

    async def step(self, action: str, message: dict[str, Any] | None = None) -> EnvStep:
        result = await self.client.step({self.action_key: action})
        text = observation_text(result.observation, self.observation_key)
        observations = [{"role": "user", "content": text}] if text and not result.done else []
        return EnvStep(observations=observations, reward=float(result.reward or 0.0), done=bool(result.done),
                       metadata=dict(result.observation.get("metadata") or {}))  # fmt: skip

    async def close(self) -> None:
        await self.client.close()


def open_environment(spec: EnvAgent) -> OpenEnvEnvironment:
    return OpenEnvEnvironment(spec)

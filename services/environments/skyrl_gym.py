"""SkyRL-Gym environments (the ``skyrl-gym`` package): ``init`` / ``step`` text environments.

Two sides, both the package's own code:

- ``tasks_from_rows``: SkyRL's dataset rows (``prompt`` — the chat —, ``env_class``, and the rest,
  ``reward_spec``, ``extra_info``, ..., which SkyRL passes to the environment as ``extras``) become
  platform tasks with an ``env`` agent; run on the client side (or by a test).
- ``open_environment``: called by the worker through ``ENV_ADAPTERS`` for an ``env`` agent of
  source ``skyrl-gym``: ``skyrl_gym.make(env, env_config=config, extras=extras)``, then ``init``
  with the chat and ``step`` with each reply, as SkyRL's own generator does. The package's calls
  are synchronous; they run in a thread so the worker's other episodes go on.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

from services.protocol import RewardSpec, Task
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_REWARD_COMMAND, EnvStep

SOURCE = "skyrl-gym"
PACKAGE = "skyrl-gym"
ROW_KEYS = ("prompt", "env_class")  # every other key of a row is the environment's ``extras``


class RowError(ValueError):
    """A dataset row this adapter cannot map (the message names the row and the field)."""


def package_version() -> str:
    return f"{PACKAGE} {importlib.metadata.version(PACKAGE)}"


def tasks_from_rows(rows: list[dict[str, Any]], *, env_config: dict[str, Any] | None = None,
                    id_prefix: str = "skyrl") -> list[Task]:  # fmt: skip
    """One task per row; the row's chat is the agent's first messages, its last user message the prompt."""
    tasks = []
    version = package_version()
    for index, row in enumerate(rows):
        prompt, env_class = row.get("prompt"), row.get("env_class")
        if not isinstance(env_class, str) or not env_class:
            raise RowError(f"row {index}: env_class must name a registered skyrl_gym environment")
        if not isinstance(prompt, list) or not prompt or not all(_is_message(m) for m in prompt):
            raise RowError(f"row {index}: prompt must be a non-empty chat (a list of {{role, content}} messages)")
        users = [m["content"] for m in prompt if m["role"] == "user"]
        extras = {k: v for k, v in row.items() if k not in ROW_KEYS}
        agent = EnvAgent(source=SOURCE, env=env_class, config=env_config or {}, extras=extras, messages=prompt)
        task_id = str(row.get("id") or (row.get("extra_info") or {}).get("id") or f"{id_prefix}-{index}")
        tasks.append(Task(id=task_id, prompt=(users or [prompt[-1]["content"]])[-1] or env_class,
                          reward=RewardSpec(command=ENV_REWARD_COMMAND, parse_float=True), agent=agent,
                          source=SOURCE, source_version=version))  # fmt: skip
    return tasks


def _is_message(message: Any) -> bool:
    return isinstance(message, dict) and all(isinstance(message.get(k), str) for k in ("role", "content"))


class SkyRLGymEnvironment:
    """A ``skyrl_gym`` environment behind ``SteppedEnvironment``."""

    def __init__(self, spec: EnvAgent) -> None:
        import skyrl_gym  # the package is needed only where these environments run

        self.env = skyrl_gym.make(spec.env, env_config=spec.config, extras=spec.extras)

    async def reset(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        chat, _ = await asyncio.to_thread(self.env.init, messages)
        return list(chat)

    async def step(self, action: str, message: dict[str, Any] | None = None) -> EnvStep:
        out = await asyncio.to_thread(self.env.step, action)
        return EnvStep(observations=list(out.get("observations") or []), reward=float(out["reward"]),
                       done=bool(out["done"]), metadata=dict(out.get("metadata") or {}))  # fmt: skip

    async def close(self) -> None:
        await asyncio.to_thread(self.env.close)


def open_environment(spec: EnvAgent) -> SkyRLGymEnvironment:
    return SkyRLGymEnvironment(spec)

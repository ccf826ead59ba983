"""The stepping interface between the worker and an outside package's environment (``env`` agents).

The worker knows only this interface; one adapter module per source (``services/environments/``)
maps its package onto it, found by name in ``ENV_ADAPTERS`` (the adapters sit at the edge: the
worker never imports a package's code itself). An adapter module exposes
``open_environment(agent: EnvAgent) -> SteppedEnvironment``.

An episode: ``reset`` with the initial chat (OpenAI messages) gives the chat the policy sees first;
then, per LLM turn, ``step`` with the reply's text (and the whole message) gives the observations
(appended as the next messages), the step's reward and whether the episode is done; ``close`` always ends it. An
exception raised by the package is an infra error of the attempt, never a reward of 0.

The episode's reward is the sum of its step rewards: the worker writes them, one a line and their
sum last, to ``ENV_REWARD_FILE`` in the sandbox's working directory after every step, and the
task's reward command (``ENV_REWARD_COMMAND``, ``parse_float``) reads it back, so the platform's
one reward path scores these episodes too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

ENV_ADAPTERS: dict[str, str] = {  # source (``EnvAgent.source``) -> its adapter module
    "skyrl-gym": "services.environments.skyrl_gym",
    "openenv": "services.environments.openenv",
    "verifiers": "services.environments.verifiers_env",
    "atropos": "services.environments.atropos",
}
ENV_REWARD_FILE = ".rollout-env-reward"  # in the workdir: the step rewards and, last line, their sum
ENV_REWARD_COMMAND = f"cat {ENV_REWARD_FILE}"  # the ``RewardSpec.command`` of an ``env`` task (parse_float)


@dataclass(frozen=True, slots=True)
class EnvStep:
    observations: list[dict[str, Any]]  # the next messages (role user or tool)
    reward: float
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)


class SteppedEnvironment(Protocol):
    """An adapter may also have ``tools`` (OpenAI tool schemas), sent with every LLM turn."""

    async def reset(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]: ...

    # ``action`` is the reply's text; ``message`` the whole assistant message (its tool calls, if any)
    async def step(self, action: str, message: dict[str, Any] | None = None) -> EnvStep: ...

    async def close(self) -> None: ...

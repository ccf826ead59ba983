"""One platform episode per framework sample: what the slime/miles and verl adapters share.

Frameworks that call a function per sample (slime/miles' custom generate function, verl's agent
loop) run in their own processes (Ray actors) and hand over only the sample and the sampling
parameters. The platform is named by the environment, which Ray passes to its actors:
``ROLLOUT_CLIENT_API_URL``, ``ROLLOUT_CLIENT_TOKEN`` (the job's) and ``ROLLOUT_CLIENT_JOB``
(:meth:`EpisodeConfig.from_env`), or set once in the process with :func:`configure`.

The task of a sample is its metadata's ``task`` (a platform ``Task`` as a dict; its ``prompt``
defaults to the sample's prompt). :class:`EpisodeRunner` submits it as a one-sample rollout (the
framework groups its samples itself) and waits for the trajectory, reading the job's stream over
the API once for every caller in the process (one reader, one cursor).
"""

from __future__ import annotations

import asyncio
import os
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from rollout_client.http import AsyncRolloutClient
from services.protocol.agents import AgentSpec, BashAgent
from services.protocol.tasks import AgentLimits, RolloutRequest, SamplingParams, Task
from services.protocol.trajectory import Trajectory

# SGLang sampling keys a platform episode honours (the rest of a framework's dict is its own business)
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed", "repetition_penalty")


@dataclass
class EpisodeConfig:
    api_url: str
    token: str
    job: str
    limits: AgentLimits = field(default_factory=AgentLimits)
    agent: AgentSpec = field(default_factory=BashAgent)
    max_attempts: int = 3
    idle_timeout_s: float = 3600.0  # TimeoutError when the job's stream brought nothing for this long

    @classmethod
    def from_env(cls) -> EpisodeConfig:
        missing = [
            n for n in ("ROLLOUT_CLIENT_API_URL", "ROLLOUT_CLIENT_TOKEN", "ROLLOUT_CLIENT_JOB") if n not in os.environ
        ]
        if missing:
            raise RuntimeError(f"set {', '.join(missing)} (or call rollout_client.episodes.configure) in this process")
        env = os.environ
        return cls(env["ROLLOUT_CLIENT_API_URL"], env["ROLLOUT_CLIENT_TOKEN"], env["ROLLOUT_CLIENT_JOB"])


def task_of(prompt: Any, metadata: dict[str, Any] | None) -> Task:
    """The platform task of a framework sample: ``metadata["task"]``, its prompt defaulting to the sample's."""
    spec = (metadata or {}).get("task")
    if not isinstance(spec, dict):
        raise ValueError("the sample's metadata has no 'task' (a platform Task as a dict)")
    text = prompt if isinstance(prompt, str) else str(prompt[-1].get("content", "")) if prompt else ""
    return Task.model_validate({"id": "task", **spec, "prompt": spec.get("prompt") or text})


def sampling_of(params: dict[str, Any] | None) -> SamplingParams:
    """The framework's sampling dict as the platform's (the keys an episode honours)."""
    return SamplingParams.model_validate(
        {k: v for k, v in (params or {}).items() if k in _SAMPLING_KEYS and v is not None}
    )


class EpisodeRunner:
    """Runs tasks as one-sample rollouts of the job and returns their trajectories."""

    def __init__(self, config: EpisodeConfig) -> None:
        self.config = config
        self.client = AsyncRolloutClient(config.api_url, config.token)
        self.cursor: str | None = None  # the job stream's last entry read by this process
        self.found: dict[str, list[Trajectory]] = {}  # rollout id -> its trajectories, read but not yet taken
        self._reading = asyncio.Lock()

    async def run(self, task: Task, sampling: SamplingParams | None = None) -> Trajectory:
        c = self.config
        request = RolloutRequest(job=c.job, tasks=[task], group_size=1, limits=c.limits, agent=c.agent,
                                 sampling=sampling or SamplingParams(), max_attempts=c.max_attempts)  # fmt: skip
        rollout_id = (await self.client.submit(request)).rollout_id
        while not self.found.get(rollout_id):
            async with self._reading:  # one reader at a time; the others find theirs in ``found``
                if self.found.get(rollout_id):
                    break
                stream = self.client.trajectories(c.job, after=self.cursor, idle_timeout_s=c.idle_timeout_s)
                async with aclosing(stream) as events:
                    async for event in events:
                        self.cursor = event.entry_id
                        self.found.setdefault(event.trajectory.rollout_id, []).append(event.trajectory)
                        if self.found.get(rollout_id):
                            break
        return self.found.pop(rollout_id)[0]


_runner: EpisodeRunner | None = None


def configure(config: EpisodeConfig) -> EpisodeRunner:
    """Name the platform for this process (instead of the environment)."""
    global _runner
    _runner = EpisodeRunner(config)
    return _runner


def runner() -> EpisodeRunner:
    """The process's runner (configured, or from the environment on first use)."""
    return _runner or configure(EpisodeConfig.from_env())

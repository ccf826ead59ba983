"""Atropos environments (the ``atroposlib`` package): ``BaseEnv`` subclasses with ``setup`` /
``get_next_item`` / ``collect_trajectories`` / ``score``.

An Atropos environment drives the LLM itself (``self.server.chat_completion``) and scores a group
of completions per item. Mapped onto the stepping interface (``driven_rollout``):

- ``tasks_from_environment``: ``"module:Class"`` (a ``BaseEnv`` subclass importable where the
  workers run), its ``config_init`` config with ``config`` overrides, ``setup``, then
  ``get_next_item`` ``n`` times: one task per item (the item, JSON, in ``agent.extras["item"]``).
- ``open_environment``: the worker's episode runs the environment's own ``collect_trajectories(item)``
  then ``postprocess_histories``, with ``group_size`` 1 (the platform's ``group_size`` makes the
  group: one episode per completion) and ``ensure_scores_are_not_same`` off (a group of one always
  has one score). Its server is replaced by one whose ``chat_completion`` is the worker's LLM turn
  (through the episode's gateway session); a call with ``n`` > 1 is refused. The environment's
  score for the completion (``scores[0]`` of the one group) is the reward, at the last step.
  A group the environment drops (``None``) or that is not one group of one is an infra error.

One environment object per (class, config) per process, ``setup`` run once, shared by its episodes
as Atropos' own ``env_manager`` shares it between concurrent ``collect_trajectories``; each
episode's calls reach its own worker turn through a context variable.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import importlib.metadata
import json
import threading
from typing import Any

from services.environments.driven_rollout import DrivenRollout, chat_completion, observations
from services.protocol import RewardSpec, Task
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_REWARD_COMMAND, EnvStep

SOURCE = "atropos"
PACKAGE = "atroposlib"
FORCED = {"group_size": 1, "ensure_scores_are_not_same": False, "use_wandb": False}  # one episode = one completion
CACHED_ENVIRONMENTS = 16
_episode: contextvars.ContextVar[DrivenRollout] = contextvars.ContextVar("atropos_episode")
_environments: dict[str, tuple[Any, asyncio.Lock, list[bool]]] = {}
_lock = threading.Lock()


def package_version() -> str:
    return f"{PACKAGE} {importlib.metadata.version(PACKAGE)}"


def environment_class(path: str) -> Any:
    """The ``BaseEnv`` subclass named ``module:Class`` (nothing else is instantiated)."""
    from atroposlib.envs.base import BaseEnv

    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"an Atropos environment is named module:Class, not {path!r}")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseEnv)):
        raise ValueError(f"{path} is not an atroposlib BaseEnv subclass")
    return cls


def make_environment(path: str, overrides: dict[str, Any]) -> Any:
    """The environment as its ``config_init`` configures it, ``overrides`` and ``FORCED`` applied; no
    inference servers (its server is the worker's)."""
    from atroposlib.envs.server_handling.server_baseline import ServerBaseline

    cls = environment_class(path)
    config, _ = cls.config_init()
    config = type(config).model_validate({**config.model_dump(), **overrides, **FORCED})
    return cls(config, ServerBaseline(), testing=True)


def tasks_from_environment(path: str, n: int, config: dict[str, Any] | None = None) -> list[Task]:
    """One task per item of the environment's ``get_next_item`` (after its ``setup``), ``n`` items."""
    env = make_environment(path, dict(config or {}))

    async def items() -> list[Any]:
        await env.setup()
        return [await env.get_next_item() for _ in range(n)]

    version, tasks = package_version(), []
    for index, item in enumerate(asyncio.run(items())):
        try:
            item = json.loads(json.dumps(item))
        except TypeError as exc:
            raise ValueError(f"{path}: item {index} is not JSON ({exc}); only JSON items can be carried") from None
        text = next((v for v in (item.values() if isinstance(item, dict) else [item]) if isinstance(v, str)), "")
        agent = EnvAgent(source=SOURCE, env=path, config=dict(config or {}), extras={"item": item})
        tasks.append(Task(id=f"{path.rsplit(':', 1)[-1].lower()}-{index}", prompt=text or json.dumps(item)[:2000],
                          agent=agent, source=SOURCE, source_version=version,
                          reward=RewardSpec(command=ENV_REWARD_COMMAND, parse_float=True)))  # fmt: skip
    return tasks


class _Server:
    """The environment's ``server`` (its ``ServerManager``) in the worker: calls are the episode's turns."""

    async def chat_completion(self, **arguments: Any) -> Any:
        if int(arguments.get("n") or 1) != 1:
            raise ValueError(
                f"n={arguments['n']}: an episode is one completion (the platform's group_size makes groups)"
            )
        return await _episode.get().ask(list(arguments.pop("messages")), **arguments)

    async def completion(self, **_: Any) -> Any:
        raise NotImplementedError("completion-style (prompt string) calls are not stepped; use chat_completion")

    def managed_server(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("managed_server (token-level tracking) is not stepped; the gateway records tokens")


def _loaded(spec: EnvAgent) -> tuple[Any, asyncio.Lock, list[bool]]:
    key = json.dumps([spec.env, spec.config], sort_keys=True, default=str)
    with _lock:
        if key not in _environments:
            env = make_environment(spec.env, dict(spec.config))
            env.server = _Server()
            _environments[key] = (env, asyncio.Lock(), [False])
            while len(_environments) > CACHED_ENVIRONMENTS:
                _environments.pop(next(iter(_environments)))
        return _environments[key]


class AtroposEnvironment:
    """One item's ``collect_trajectories`` behind ``SteppedEnvironment``."""

    def __init__(self, spec: EnvAgent) -> None:
        self.env, self.setup_lock, self.set_up = _loaded(spec)
        self.item = spec.extras.get("item")
        self.driven = DrivenRollout()

    async def reset(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self.setup_lock:
            if not self.set_up[0]:
                await self.env.setup()
                self.set_up[0] = True
        _episode.set(self.driven)  # copied into the rollout's task: its server calls reach this episode
        request = await self.driven.start(self._collect)
        if request is None:
            raise RuntimeError("collect_trajectories returned without asking the LLM")
        return list(request.messages)

    async def _collect(self) -> Any:
        group, _backlog = await self.env.collect_trajectories(self.item)
        return await self.env.postprocess_histories(group) if group else group

    async def step(self, action: str, message: dict[str, Any] | None = None) -> EnvStep:
        sent = self.driven.request
        assert sent is not None
        request = await self.driven.answer(chat_completion(action, message))
        if request is not None:
            return EnvStep(observations=observations(sent, request), reward=0.0, done=False)
        group = self.driven.result()
        if isinstance(group, list) and len(group) == 1:
            group = group[0]
        if not isinstance(group, dict):
            raise RuntimeError(f"the environment scored no group for this completion (it returned {group!r:.200})")
        scores = list(group.get("scores") or [])
        if len(scores) != 1:
            raise RuntimeError(f"the environment returned {len(scores)} scores for one completion")
        return EnvStep(observations=[], reward=float(scores[0]), done=True)

    async def close(self) -> None:
        await self.driven.close()


def open_environment(spec: EnvAgent) -> AtroposEnvironment:
    return AtroposEnvironment(spec)

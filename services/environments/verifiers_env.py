"""verifiers environments (the ``verifiers`` package, 0.1.x: ``SingleTurnEnv``, ``MultiTurnEnv``,
``ToolEnv``, any ``Environment`` whose ``rollout`` asks a chat client for each turn).

- ``tasks_from_environment``: the environment's dataset (``get_dataset`` / ``get_eval_dataset``) becomes
  platform tasks with an ``env`` agent of source ``verifiers``: ``env`` is the environment's id as
  ``verifiers.load_environment`` takes it (an installed environment module), ``config`` its
  ``env_args``, ``extras`` the row (``prompt``, ``answer``, ``info``, ``task``, ``example_id``).
- ``open_environment``: called by the worker through ``ENV_ADAPTERS``. The package's own ``rollout``
  runs unchanged, with a chat client whose ``create`` hands the request to the worker and waits
  for the worker's reply (the LLM turn, through the episode's gateway session). So the package
  itself builds each prompt, calls ``env_response`` between turns (tools run by ``ToolEnv``),
  checks its stop conditions, and at the end its rubric's ``score_rollout`` gives the reward
  (the last step's reward; earlier steps give 0). The tools the environment offers
  (``oai_tools``) go with every LLM turn; the reply's tool calls reach the package as parsed by
  the gateway. A rollout that ends with an error in its state (``vf.Error``) is an infra error.

One environment object per (id, ``env_args``) per process, shared by its episodes as verifiers'
own ``generate`` shares it between concurrent rollouts (its dataset is built once). Building one
would also replace the process's SIGINT / SIGTERM handlers and register an ``atexit`` hook per
object (``Environment.__post_init__``), which in a worker would take over its shutdown (and fails
outside the main thread): those two module references of the package's environment module are
made inert here, so the worker keeps its own handling; teardown handlers are not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import signal
import threading
from typing import Any

from services.protocol import RewardSpec, Task
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_REWARD_COMMAND, EnvStep

SOURCE = "verifiers"
PACKAGE = "verifiers"
ROW_KEYS = ("prompt", "answer", "info", "task", "example_id")  # a dataset row's fields the rollout gets


def package_version() -> str:
    return f"{PACKAGE} {importlib.metadata.version(PACKAGE)}"


def tasks_from_environment(env_id: str, env_args: dict[str, Any] | None = None, *, split: str = "train",
                           n: int = -1) -> list[Task]:  # fmt: skip
    """One task per row of the environment's dataset (``split``: "train" or "eval"; ``n`` rows, -1 all)."""
    env = load_environment(env_id, dict(env_args or {}))
    dataset = env.get_dataset(n) if split == "train" else env.get_eval_dataset(n)
    version = package_version()
    tasks = []
    for row in dataset:
        prompt = row["prompt"]
        if not isinstance(prompt, list):
            raise ValueError(f"{env_id}: row {row.get('example_id')}: only chat environments (message_type "
                             "'chat') can be stepped; this prompt is a completion string")  # fmt: skip
        extras = {k: row[k] for k in ROW_KEYS if k in row and row[k] is not None}
        users = [m["content"] for m in prompt if m.get("role") == "user" and isinstance(m.get("content"), str)]
        agent = EnvAgent(source=SOURCE, env=env_id, config=dict(env_args or {}), extras=extras,
                         messages=[{"role": str(m["role"]), "content": str(m["content"])} for m in prompt])  # fmt: skip
        tasks.append(Task(id=f"{env_id.rsplit('.', 1)[-1]}-{split}-{row['example_id']}",
                          prompt=(users or [env_id])[-1], agent=agent, source=SOURCE, source_version=version,
                          reward=RewardSpec(command=ENV_REWARD_COMMAND, parse_float=True)))  # fmt: skip
    return tasks


CACHED_ENVIRONMENTS = 16  # per process; the oldest is dropped past it
_environments: dict[str, Any] = {}
_lock = threading.Lock()


class _Inert:
    """``signal`` and ``atexit`` as verifiers' environment module sees them in this process."""

    SIGINT, SIGTERM, default_int_handler = signal.SIGINT, signal.SIGTERM, signal.default_int_handler

    @staticmethod
    def signal(*_: Any) -> None:
        return None

    @staticmethod
    def register(*_: Any, **__: Any) -> None:
        return None


def load_environment(env_id: str, env_args: dict[str, Any]) -> Any:
    """The environment ``verifiers.load_environment(env_id, **env_args)`` gives, built once per process."""
    import verifiers as vf
    from verifiers.envs import environment

    key = json.dumps([env_id, env_args], sort_keys=True, default=str)
    with _lock:
        if key not in _environments:
            environment.signal, environment.atexit = _Inert, _Inert
            _environments[key] = vf.load_environment(env_id, **env_args)
            while len(_environments) > CACHED_ENVIRONMENTS:
                _environments.pop(next(iter(_environments)))
        return _environments[key]


class _Request:
    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class _Bridge:
    """The chat client the package's rollout talks to: each ``create`` is one LLM turn for the worker."""

    def __init__(self) -> None:
        self.chat = self
        self.completions = self
        self.requests: asyncio.Queue[_Request] = asyncio.Queue()

    async def create(self, *, messages: list[dict[str, Any]], **_: Any) -> Any:
        request = _Request([dict(m) for m in messages])
        await self.requests.put(request)
        return await request.reply


class VerifiersEnvironment:
    """A verifiers environment's rollout behind ``SteppedEnvironment``."""

    def __init__(self, spec: EnvAgent) -> None:
        self.env = load_environment(spec.env, dict(spec.config))
        if self.env.message_type != "chat":
            raise ValueError(f"{spec.env}: only chat environments can be stepped, not {self.env.message_type!r}")
        self.input = {**spec.extras, "prompt": spec.extras.get("prompt") or list(spec.messages)}
        self.input.setdefault("example_id", 0)
        self.tools: list[dict[str, Any]] = list(self.env.oai_tools or [])
        self.bridge: _Bridge | None = None
        self.rollout: asyncio.Task[Any] | None = None
        self.request: _Request | None = None

    async def reset(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.bridge = _Bridge()
        self.rollout = asyncio.ensure_future(self.env.rollout(self.input, self.bridge, "policy"))
        state = await self._next()
        if state is not None:
            raise RuntimeError(f"the rollout ended before its first LLM turn (stop: {state.get('stop_condition')})")
        assert self.request is not None
        return list(self.request.messages)

    async def step(self, action: str, message: dict[str, Any] | None = None) -> EnvStep:
        from openai.types.chat import ChatCompletion

        assert self.request is not None
        sent = self.request.messages
        reply = {"role": "assistant", "content": action, **(message or {})}
        choice = {"index": 0, "message": reply, "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}
        doc = {"id": "env-step", "object": "chat.completion", "created": 0, "model": "policy", "choices": [choice]}
        self.request.reply.set_result(ChatCompletion.model_validate(doc))
        state = await self._next()
        if state is None:  # the package asks for another turn: what it added after the reply is the observation
            assert self.request is not None
            return EnvStep(observations=self.request.messages[len(sent) + 1 :], reward=0.0, done=False)
        if state.get("error") is not None:
            raise RuntimeError(f"the rollout ended with an error: {state['error']!r}")
        await self.env.rubric.score_rollout(state)
        metrics = {k: float(v) for k, v in (state.get("metrics") or {}).items()}
        return EnvStep(observations=[], reward=float(state["reward"]), done=True,
                       metadata={"stop_condition": state.get("stop_condition"), "metrics": metrics})  # fmt: skip

    async def _next(self) -> Any:
        """The package's next LLM request (``None`` returned, ``self.request`` set) or its finished state."""
        assert self.bridge is not None and self.rollout is not None
        asked = asyncio.ensure_future(self.bridge.requests.get())
        await asyncio.wait({asked, self.rollout}, return_when=asyncio.FIRST_COMPLETED)
        if asked.done():
            self.request = asked.result()
            return None
        asked.cancel()
        return self.rollout.result()

    async def close(self) -> None:
        if self.rollout is not None and not self.rollout.done():
            self.rollout.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.rollout


def open_environment(spec: EnvAgent) -> VerifiersEnvironment:
    return VerifiersEnvironment(spec)

"""verifiers environments (the ``verifiers`` package, 0.1.x: ``SingleTurnEnv``, ``MultiTurnEnv``,
``ToolEnv``, any ``Environment`` whose ``rollout`` asks a chat client for each turn).

- ``tasks_from_environment``: the environment's dataset (``get_dataset`` / ``get_eval_dataset``) becomes
  platform tasks with an ``env`` agent of source ``verifiers``: ``env`` is the environment's id as
  ``verifiers.load_environment`` takes it (an installed environment module), ``config`` its
  ``env_args``, ``extras`` the row (``prompt``, ``answer``, ``info``, ``task``, ``example_id``).
- ``open_environment``: called by the worker through ``ENV_ADAPTERS``. The package's own ``rollout``
  runs unchanged (``driven_rollout``), with a chat client whose ``create`` hands the request to the
  worker and waits for the worker's reply (the LLM turn, through the episode's gateway session). So the package
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

import importlib.metadata
import json
import signal
import threading
from typing import Any

from services.environments.driven_rollout import DrivenRollout, chat_completion, observations
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


class _Client:
    """The ``AsyncOpenAI`` the package's rollout is given: each ``chat.completions.create`` is a worker turn."""

    def __init__(self, driven: DrivenRollout) -> None:
        self.chat = self
        self.completions = self
        self.driven = driven

    async def create(self, *, messages: list[dict[str, Any]], **arguments: Any) -> Any:
        return await self.driven.ask(messages, **arguments)


class VerifiersEnvironment:
    """A verifiers environment's rollout behind ``SteppedEnvironment``."""

    def __init__(self, spec: EnvAgent) -> None:
        self.env = load_environment(spec.env, dict(spec.config))
        if self.env.message_type != "chat":
            raise ValueError(f"{spec.env}: only chat environments can be stepped, not {self.env.message_type!r}")
        self.input = {**spec.extras, "prompt": spec.extras.get("prompt") or list(spec.messages)}
        self.input.setdefault("example_id", 0)
        self.tools: list[dict[str, Any]] = list(self.env.oai_tools or [])
        self.driven = DrivenRollout()

    async def reset(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        request = await self.driven.start(lambda: self.env.rollout(self.input, _Client(self.driven), "policy"))
        if request is None:
            stop = self.driven.result().get("stop_condition")
            raise RuntimeError(f"the rollout ended before its first LLM turn (stop: {stop})")
        return list(request.messages)

    async def step(self, action: str, message: dict[str, Any] | None = None) -> EnvStep:
        sent = self.driven.request
        assert sent is not None
        request = await self.driven.answer(chat_completion(action, message))
        if request is not None:  # the package asks for another turn
            return EnvStep(observations=observations(sent, request), reward=0.0, done=False)
        state = self.driven.result()
        if state.get("error") is not None:
            raise RuntimeError(f"the rollout ended with an error: {state['error']!r}")
        await self.env.rubric.score_rollout(state)
        metrics = {k: float(v) for k, v in (state.get("metrics") or {}).items()}
        return EnvStep(observations=[], reward=float(state["reward"]), done=True,
                       metadata={"stop_condition": state.get("stop_condition"), "metrics": metrics})  # fmt: skip

    async def close(self) -> None:
        await self.driven.close()


def open_environment(spec: EnvAgent) -> VerifiersEnvironment:
    return VerifiersEnvironment(spec)

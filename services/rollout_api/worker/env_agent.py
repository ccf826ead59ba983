"""The ``env`` agent: an outside package's environment stepped between LLM turns, through the
episode's gateway session (so its tokens are recorded like every gateway agent's).

The environment is opened by its source's adapter (``ENV_ADAPTERS``, looked up by name: the worker
imports no package itself) and spoken to only through ``SteppedEnvironment``. After every step the
rewards so far are written to ``ENV_REWARD_FILE`` for the task's reward command.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

from services.protocol import Cap, ErrorCode, InfraStage
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_ADAPTERS, ENV_REWARD_FILE, EnvStep, SteppedEnvironment
from services.protocol.trajectory import AgentRun
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.tools_agent import gateway_chat

log = logging.getLogger(__name__)


def _open(spec: EnvAgent) -> SteppedEnvironment:
    env: SteppedEnvironment = importlib.import_module(ENV_ADAPTERS[spec.source]).open_environment(spec)
    return env


async def open_environment(spec: EnvAgent) -> SteppedEnvironment:
    """The source's adapter opens it, in a thread: a package's first import takes seconds (OpenEnv's
    pulls in gradio), which the worker's other episodes and its heartbeat must not wait for."""
    try:
        env = await asyncio.to_thread(_open, spec)
    except Exception as exc:  # the package is missing or refused the environment
        raise _failed(spec, "open", exc, retryable=False) from exc  # the same on every attempt
    return env


def _failed(spec: EnvAgent, what: str, exc: BaseException, *, retryable: bool = True) -> InfraError:
    return InfraError(InfraStage.WORKER, ErrorCode.INTERNAL_ERROR,
                      f"{spec.source} environment {spec.env!r}: {what} raised {exc!r}"[:1000],
                      retryable=retryable)  # fmt: skip


@dataclass
class EnvRun:
    spec: EnvAgent
    http: aiohttp.ClientSession
    base_url: str  # the session's OpenAI base URL
    token: str
    broker: BrokerClient
    lease_id: str
    workdir: str
    max_turns: int

    async def run(self, task: str, record: AgentRun) -> Cap | None:
        env = await open_environment(self.spec)
        rewards: list[float] = []
        try:
            try:
                messages = await env.reset(list(self.spec.messages) or [{"role": "user", "content": task}])
            except Exception as exc:
                raise _failed(self.spec, "reset", exc) from exc
            await self._record(rewards)
            tools = list(getattr(env, "tools", None) or [])  # the tools the environment offers, if any
            for _ in range(self.max_turns):
                doc = await self._complete(messages, tools)
                if doc is None:  # a cap refused the call; the gateway marked the session truncated
                    return None
                choice = doc["choices"][0]
                reply = _echo(choice["message"])
                text = reply["content"]
                messages.append(reply)
                record.last_output = text[-2000:]
                if choice["finish_reason"] == "length":
                    return Cap.TURN_TOKENS
                step = await self._step(env, text, reply)
                rewards.append(float(step.reward))
                await self._record(rewards)
                if step.done:
                    return None
                messages += step.observations
            return Cap.TURNS
        finally:
            try:
                await env.close()
            except Exception:  # the episode's record is written: a close that fails costs nothing more
                log.warning("%s environment %r: close failed", self.spec.source, self.spec.env, exc_info=True)

    async def _step(self, env: SteppedEnvironment, action: str, reply: dict[str, Any]) -> EnvStep:
        try:
            return await env.step(action, reply)
        except Exception as exc:
            raise _failed(self.spec, "step", exc) from exc

    async def _record(self, rewards: list[float]) -> None:
        lines = [repr(r) for r in rewards] + [repr(sum(rewards))]
        await self.broker.write_file(self.lease_id, f"{self.workdir.rstrip('/')}/{ENV_REWARD_FILE}",
                                     "\n".join(lines) + "\n")  # fmt: skip

    async def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any] | None:
        return await gateway_chat(self.http, self.base_url, self.token, messages, tools or None)


def _echo(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as the conversation goes on with it (its tool calls, if any, kept)."""
    out: dict[str, Any] = {"role": "assistant", "content": str(message.get("content") or "")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out

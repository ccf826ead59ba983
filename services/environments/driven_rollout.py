"""A package's own rollout, stepped by the worker: for packages whose environments drive the LLM
themselves (verifiers' ``Environment.rollout``, Atropos' ``collect_trajectories``).

The package's coroutine runs unchanged as an asyncio task; the chat client it is given (each
adapter wraps ``ask`` in the shape its package calls) hands every LLM request to the worker and
waits for the reply, which the worker gets through the episode's gateway session. So the package
builds every prompt and runs its own environment logic between turns, and the worker's
``SteppedEnvironment`` sees: ``start`` -> the first request's messages; ``answer`` -> the next
request (what the package added after the reply is the step's observation) or the rollout's result.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    """One LLM call the package made: its messages, its other arguments, and the reply it waits for."""

    messages: list[dict[str, Any]]
    arguments: dict[str, Any] = field(default_factory=dict)
    reply: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class DrivenRollout:
    def __init__(self) -> None:
        self.requests: asyncio.Queue[Request] = asyncio.Queue()
        self.task: asyncio.Task[Any] | None = None
        self.request: Request | None = None  # the call the package waits on

    async def ask(self, messages: list[dict[str, Any]], **arguments: Any) -> Any:
        """The package's LLM call: returns what the worker answers (in the package's own response type)."""
        request = Request([dict(m) for m in messages], arguments)
        await self.requests.put(request)
        return await request.reply

    async def start(self, rollout: Callable[[], Awaitable[Any]]) -> Request | None:
        """Run the package's rollout until its first LLM call (returned) or its end (None; see ``result``)."""
        self.task = asyncio.ensure_future(rollout())
        return await self._next()

    async def answer(self, reply: Any) -> Request | None:
        """Give the pending call its reply; then the package's next call, or None when the rollout ended."""
        assert self.request is not None and not self.request.reply.done(), "no LLM call is pending"
        self.request.reply.set_result(reply)
        return await self._next()

    def result(self) -> Any:
        """The rollout's return value (raises what the package raised)."""
        assert self.task is not None and self.task.done()
        return self.task.result()

    async def _next(self) -> Request | None:
        assert self.task is not None
        asked = asyncio.ensure_future(self.requests.get())
        await asyncio.wait({asked, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if asked.done():
            self.request = asked.result()
            return self.request
        asked.cancel()
        self.task.result()  # the package raised: the caller's error
        self.request = None
        return None

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def observations(before: Request, after: Request) -> list[dict[str, Any]]:
    """What the package added to its conversation after the reply to ``before`` (the step's observations)."""
    return after.messages[len(before.messages) + 1 :]


def chat_completion(action: str, message: dict[str, Any] | None = None) -> Any:
    """The worker's reply as the ``openai`` ChatCompletion the package's client would have returned
    (the gateway's assistant message: its text and its tool calls, if any)."""
    from openai.types.chat import ChatCompletion

    reply = {"role": "assistant", "content": action, **(message or {})}
    choice = {"index": 0, "message": reply, "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}
    doc = {"id": "env-step", "object": "chat.completion", "created": 0, "model": "policy", "choices": [choice]}
    return ChatCompletion.model_validate(doc)

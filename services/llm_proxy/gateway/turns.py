"""One gateway call, whatever its wire format: caps, prompt ids, the engine call, tool-call parsing,
the record in the session log.

Caps (the episode's ``AgentLimits``): a call past the turn cap is refused with 403, a prompt at or
past the trajectory-token cap or the engine context with 400 ``context_length_exceeded`` (the
message litellm maps to ``ContextWindowExceededError``, so agents stop instead of retrying);
either way the session is marked truncated with that cap (the turn cap is checked again by the
record itself, so concurrent calls cannot pass it). New tokens per call are clamped to
``max_tokens_per_turn`` and to the room left in the trajectory.

A call is recorded at the index it was planned at only when no other call was recorded meanwhile
(``sessions.RECORD``); otherwise it is recorded at the log's end as the start of a new segment,
with the same ids (it was generated from exactly those), and its answer is built again with its
index (counted in ``rollout_gateway_replanned``). The engine is never called twice for a call.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from aiohttp import web

from services.llm_proxy.calls import Forwarder
from services.llm_proxy.gateway.engine import EngineAnswer, EngineRequest, generate
from services.llm_proxy.gateway.metrics import GatewayMetrics
from services.llm_proxy.gateway.parsers import ParsedReply, parse_tool_calls
from services.llm_proxy.gateway.pools import PoolConfigs
from services.llm_proxy.gateway.requests import template_call
from services.llm_proxy.gateway.sessions import Recorded, SessionStore, SessionView
from services.llm_proxy.gateway.tokens import Context, Messages, Plan, plan_chat, plan_ids
from services.protocol import Cap, ErrorCode, PlatformError
from services.protocol.gateway import GatewayCall, GatewaySession
from services.protocol.trajectory import logprobs, token_ids

Route = Literal["chat", "completions", "messages", "responses", "gemini"]
T = TypeVar("T")
MAX_MOVES = 16  # records tried per call when other calls of the session keep being recorded first


@dataclass(frozen=True, slots=True)
class TurnRequest:
    route: Route
    messages: Messages | None  # chat routes
    tools: list[dict[str, Any]] | None
    prompt: str | list[int] | None  # /v1/completions
    max_tokens: int | None  # the client's cap (a cap only: sampling is the platform's)
    top_logprobs: int = 0
    stop: list[str] | None = None
    unused: tuple[str, ...] = ()  # request fields that did not change the tokens (``fields.audit``)

    @property
    def assistants(self) -> int | None:
        """Assistant turns in the messages (None: a raw prompt)."""
        if self.messages is None:
            return None
        return sum(1 for m in self.messages if m.get("role") == "assistant")


@dataclass(frozen=True, slots=True)
class TurnResult:
    view: SessionView
    plan: Plan
    answer: EngineAnswer
    text: str  # the generated text without the end-of-turn token
    parsed: ParsedReply

    @property
    def index(self) -> int:
        return self.view.index

    @property
    def truncated(self) -> bool:
        return self.answer.finish_reason == "length"

    def moved(self, length: int, segments: int) -> TurnResult:
        """The same call recorded at the end of a log of ``length`` calls, as the start of segment
        ``segments``."""
        view = replace(self.view, recorded=length, segments=segments)
        return replace(self, view=view, plan=replace(self.plan, segment=segments, merged=False))


class Turns:
    def __init__(self, forwarder: Forwarder, store: SessionStore, pools: PoolConfigs, metrics: GatewayMetrics) -> None:
        self.forwarder = forwarder
        self.store = store
        self.pools = pools
        self.metrics = metrics

    async def run(
        self, request: web.Request, session: GatewaySession, turn: TurnRequest, answer: Callable[[TurnResult], T]
    ) -> T:
        """Plan the call's prompt ids (from this process's copy of the session's last call when it is
        trusted, else from Redis), check the caps, generate, record, and return ``answer`` of the
        result: built while the record is in flight, returned only once it is recorded (a failed
        record fails the call, so an answer the agent gets is always in the session log)."""
        started = time.perf_counter()
        connection = id(getattr(request, "transport", None))
        assistants = turn.assistants
        view = self.store.trusted(session, assistants, connection)
        if view is None:
            view = await self.store.read(session)
        plan = self._plan(session, turn, view.last, view.segments)
        max_new = await self._caps(session, view, plan, turn.max_tokens)
        reply = await self._answered(self._engine(request, session, plan, max_new, turn), session, plan)
        result = self._result(view, plan, reply, turn, session)
        for _ in range(MAX_MOVES):
            recording = self._record(session, result, turn, started, (assistants, connection))  # sent: Redis runs it
            try:
                built = answer(result)
            finally:
                recorded = await recording
            if recorded.outcome == "recorded":
                added_s = time.perf_counter() - started - reply.llm_s
                names = frozenset(t["function"]["name"] for t in turn.tools or [])
                self.metrics.observe(turn.route, result.plan, result.parsed, added_s, session.pool, names)
                return built
            if recorded.outcome == "turn_cap":
                self.metrics.caps.labels(Cap.TURNS.value).inc()
                raise _turn_cap(session)
            # another call was recorded since the plan: this one starts a new segment at the log's end
            self.metrics.replanned.inc()
            result = result.moved(recorded.length, recorded.segments)
        raise PlatformError(
            ErrorCode.ENGINE_UNAVAILABLE, "the session's log kept moving (concurrent calls)", retry_after_s=1
        )

    def _plan(self, session: GatewaySession, turn: TurnRequest, last: Context | None, segments: int) -> Plan:
        chat = self.pools.template(session.pool)
        if turn.messages is not None:
            local = self.pools.local(session.pool)
            return plan_chat(chat, turn.messages, turn.tools, last, segments, local=local)
        ids = turn.prompt if isinstance(turn.prompt, list) else chat.encode(turn.prompt or "")
        return plan_ids(ids, last, segments)

    async def _caps(self, session: GatewaySession, view: SessionView, plan: Plan, client_max: int | None) -> int:
        if view.recorded >= session.max_turns:
            await self._truncate(session, Cap.TURNS)
            raise _turn_cap(session)
        if len(plan.prompt_ids) >= session.max_trajectory_tokens:
            await self._truncate(session, Cap.TRAJECTORY_TOKENS)
            raise context_error(session.max_trajectory_tokens, len(plan.prompt_ids))
        return _max_new(session, plan, client_max)

    async def _truncate(self, session: GatewaySession, cap: Cap) -> None:
        self.metrics.caps.labels(cap.value).inc()
        await self.store.mark_truncated(session, cap.value)

    async def _engine(
        self, request: web.Request, session: GatewaySession, plan: Plan, max_new: int, turn: TurnRequest
    ) -> EngineAnswer:
        engine_request = EngineRequest(
            pool=session.pool,
            prompt_ids=plan.prompt_ids,
            max_new_tokens=max_new,
            sampling=dict(session.sampling),
            affinity=session.session,
            deadline_s=session.deadline_s,
            top_logprobs=turn.top_logprobs,
            stop=list(turn.stop or []),
            routed_experts=self.pools.routed_experts(session.pool),
        )
        return await generate(self.forwarder, request, engine_request)

    async def _answered(self, engine: Awaitable[EngineAnswer], session: GatewaySession, plan: Plan) -> EngineAnswer:
        try:
            return await engine
        except PlatformError as exc:
            if exc.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED:
                await self._truncate(session, Cap.CONTEXT_LENGTH)
                raise context_error(self.forwarder.guard.context_cap, len(plan.prompt_ids)) from None
            raise

    def _result(
        self, view: SessionView, plan: Plan, answer: EngineAnswer, turn: TurnRequest, session: GatewaySession
    ) -> TurnResult:
        chat = self.pools.template(session.pool)
        visible = answer.output_ids[:-1] if answer.output_ids[-1:] == [chat.eos_id] else answer.output_ids
        text = chat.decode(visible)
        if turn.tools:
            parsed = parse_tool_calls(text, session.tool_parser or self.pools.parser(session.pool))
        else:
            parsed = ParsedReply(content=text)
        return TurnResult(view, plan, answer, text, parsed)

    def _record(
        self, session: GatewaySession, result: TurnResult, turn: TurnRequest, started: float,
        request: tuple[int | None, int],
    ) -> Awaitable[Recorded]:  # fmt: skip
        """Send the call's record (``request``: its assistant turns and connection, kept with the copy)."""
        answer, plan = result.answer, result.plan
        total = time.perf_counter() - started
        call = GatewayCall(
            index=result.index,
            segment=plan.segment,
            prompt_ids=token_ids(plan.prompt_ids),
            output_ids=token_ids(answer.output_ids),
            output_logprobs=logprobs(answer.logprobs),
            finish_reason=answer.finish_reason,
            weight_version=answer.weight_version,
            engine_id=answer.engine_id,
            route=turn.route,
            merged=plan.merged,
            mismatch=plan.mismatch,
            tool_calls=len(result.parsed.calls),
            tool_parse_errors=len(result.parsed.errors),
            routed_experts=answer.routed_experts,
            unused_fields=list(turn.unused),
            started_at=time.time() - total,
            llm_s=answer.llm_s,
            total_s=total,
        )
        chat = self.pools.template(session.pool)
        context = Context(
            messages=turn.messages or [],
            reply=_reply(result) if turn.messages is not None else None,
            tools=turn.tools,
            segment=plan.segment,
            held=[],
            ended_with_eos=answer.output_ids[-1:] == [chat.eos_id],
        )
        assistants, connection = request
        assistants = None if assistants is None else assistants + 1  # and the reply
        return self.store.record(
            session, call, context, mismatch=plan.mismatch, assistants=assistants, connection=connection
        )


def _max_new(session: GatewaySession, plan: Plan, client_max: int | None) -> int:
    """New tokens for the call: the client's cap, the episode's per-turn cap and the trajectory's room."""
    room = session.max_trajectory_tokens - len(plan.prompt_ids)
    return min(client_max or session.max_tokens_per_turn, session.max_tokens_per_turn, room)


def _turn_cap(session: GatewaySession) -> PlatformError:
    return PlatformError(ErrorCode.FORBIDDEN, f"the episode's turn cap ({session.max_turns} calls) is reached")


def _reply(result: TurnResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.parsed.content}
    if result.parsed.calls:
        message["tool_calls"] = [template_call(name, args) for name, args in result.parsed.calls]
    return message


def context_error(limit: int, prompt: int) -> PlatformError:
    """The wording litellm maps to ``ContextWindowExceededError`` (no retries)."""
    return PlatformError(
        ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
        f"{prompt} tokens (prompt is too long).",
        field="messages",
    )

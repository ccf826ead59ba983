"""One gateway call's order against a real Redis (the engine call stubbed): the answer is built while
the record is in flight and returned only once the call is recorded; a failed record fails the call;
a call recorded elsewhere meanwhile moves this one to a new segment (one engine call); a call still
in flight when the worker closes the session and reads its log is refused, never answered."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ResponseError

from services.llm_proxy.gateway.engine import EngineAnswer
from services.llm_proxy.gateway.metrics import GatewayMetrics
from services.llm_proxy.gateway.sessions import Recorded, SessionStore
from services.llm_proxy.gateway.tokens import Context
from services.llm_proxy.gateway.turns import TurnRequest, TurnResult, Turns
from services.protocol import PlatformError, keys
from services.protocol.gateway import GatewayCall, GatewaySession, token_digest
from services.protocol.trajectory import logprobs, token_ids
from services.rollout_api.worker.gateway_agents import close_session
from services.runtime.chat import ChatTemplate, bundled_chat_template
from services.runtime.redis_pool import open_redis


class _Pools:
    chat = bundled_chat_template()

    def template(self, pool: str) -> ChatTemplate:
        return self.chat

    def local(self, pool: str) -> bool:
        return True

    def parser(self, pool: str) -> str:
        return "hermes"

    def routed_experts(self, pool: str) -> None:
        return None


class _Engine:
    """Answers "fine"; counts its calls; waits for ``release`` when one is given."""

    def __init__(self, release: asyncio.Event | None = None) -> None:
        self.calls = 0
        self.started = asyncio.Event()
        self.release = release

    async def __call__(self, *args: Any) -> EngineAnswer:
        self.calls += 1
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        ids = [*_Pools.chat.encode("fine"), _Pools.chat.eos_id]
        return EngineAnswer(output_ids=ids, logprobs=[0.0] * len(ids), top_logprobs=[], finish_reason="stop",
                            weight_version="1", engine_id="e", prompt_tokens=0, cached_tokens=0, llm_s=0.0,
                            routed_experts=None)  # fmt: skip


def _session() -> GatewaySession:
    return GatewaySession(
        session=secrets.token_hex(8), token_sha256=token_digest("t"), job="j", trajectory_id="t", attempt=1,
        pool="default", expires_at=time.time() + 300, max_turns=10, max_tokens_per_turn=8, max_trajectory_tokens=999,
    )  # fmt: skip


def _turns(redis_url: str, monkeypatch: pytest.MonkeyPatch, engine: _Engine) -> Turns:
    turns = Turns(None, SessionStore(open_redis(redis_url)), _Pools(), GatewayMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    monkeypatch.setattr(turns, "_engine", engine)
    return turns


def _turn(*messages: dict[str, Any]) -> TurnRequest:
    return TurnRequest(route="chat", messages=list(messages), tools=None, prompt=None, max_tokens=None)


HI = {"role": "user", "content": "hi"}


async def test_the_answer_is_built_while_recording_and_returned_once_recorded(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = _turns(redis_url, monkeypatch, _Engine())
    store, session = turns.store, _session()
    events: list[str] = []
    recorded = store.record

    def record(*args: Any, **kwargs: Any) -> Awaitable[Recorded]:
        sent = recorded(*args, **kwargs)
        events.append("record sent")

        async def done() -> Recorded:
            outcome = await sent
            events.append("recorded")
            return outcome

        return done()

    def answer(result: TurnResult) -> str:
        events.append("answer built")
        return result.text

    monkeypatch.setattr(store, "record", record)
    try:
        assert await turns.run(None, session, _turn(HI), answer) == "fine"  # type: ignore[arg-type]
        assert events == ["record sent", "answer built", "recorded"]
        assert await store.redis.llen(keys.gateway_calls(session.session)) == 1

        def failing(*args: Any, **kwargs: Any) -> Awaitable[Recorded]:
            async def fail() -> Recorded:
                raise ResponseError("the record failed")

            return fail()

        monkeypatch.setattr(store, "record", failing)
        events.clear()
        with pytest.raises(ResponseError, match="the record failed"):
            await turns.run(None, session, _turn(HI), answer)  # type: ignore[arg-type]
        assert events == ["answer built"]  # built, but the call fails: the agent never gets it
    finally:
        store.close()
        await store.redis.aclose(close_connection_pool=True)


async def test_a_call_the_log_moved_past_is_a_new_segment_with_its_answer_built_again(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    engine = _Engine(release)
    turns = _turns(redis_url, monkeypatch, engine)
    other = SessionStore(open_redis(redis_url))  # another proxy process
    session = _session()
    try:
        turns.store.known.saw_new(session.session)
        release.set()
        reply = await turns.run(None, session, _turn(HI), lambda r: r.text)  # type: ignore[arg-type]
        release.clear()
        engine.started.clear()
        follow = _turn(HI, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"})
        call = asyncio.create_task(turns.run(None, session, follow, lambda r: (r.index, r.plan.segment, r.plan.merged)))  # type: ignore[arg-type]
        await engine.started.wait()
        elsewhere = GatewayCall(index=1, segment=1, prompt_ids=token_ids([5]), output_ids=token_ids([6]),
                                output_logprobs=logprobs([0.0]), finish_reason="stop")  # fmt: skip
        context = Context(messages=[], reply=None, tools=None, segment=1, held=[], ended_with_eos=True)
        assert (await other.record(session, elsewhere, context, mismatch=False)).outcome == "recorded"
        release.set()
        assert await call == (2, 2, False)  # after the other call, in a segment of its own
        assert engine.calls == 2  # one per call: the moved call was not generated again
        assert turns.metrics.replanned._value.get() == 1
        calls, _ = await close_session(other.redis, session.session)
        assert [(c.index, c.segment, c.merged) for c in calls] == [(0, 0, False), (1, 1, False), (2, 2, False)]
    finally:
        turns.store.close()
        await turns.store.redis.aclose(close_connection_pool=True)
        other.close()
        await other.redis.aclose(close_connection_pool=True)


async def test_a_call_in_flight_when_the_worker_reads_the_log_is_refused_not_answered(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    engine = _Engine(release)
    turns = _turns(redis_url, monkeypatch, engine)
    session = _session()
    try:
        release.set()
        reply = await turns.run(None, session, _turn(HI), lambda r: r.text)  # type: ignore[arg-type]
        release.clear()
        engine.started.clear()
        follow = _turn(HI, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"})
        call = asyncio.create_task(turns.run(None, session, follow, lambda r: r.text))  # type: ignore[arg-type]
        await engine.started.wait()
        calls, _ = await close_session(turns.store.redis, session.session)  # the agent is done: the worker reads
        assert [c.index for c in calls] == [0]
        release.set()
        with pytest.raises(PlatformError, match="has ended") as refused:
            await call
        assert refused.value.status == 404  # the agent never gets the answer
        assert await turns.store.redis.llen(keys.gateway_calls(session.session)) == 1  # nothing written after
    finally:
        turns.store.close()
        await turns.store.redis.aclose(close_connection_pool=True)

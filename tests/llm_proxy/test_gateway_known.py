"""A proxy process's copy of each session's last recorded call (``gateway/known.py``) and the
conditional record (``gateway/sessions.py``): a copy is trusted only for a call that looks like the
session's next one, a record is written only at the index it was planned at, a closed session or
the turn cap refuses it. Real Redis; two stores stand for two proxy processes."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from services.llm_proxy.gateway.known import Known, KnownSessions
from services.llm_proxy.gateway.sessions import Recorded, SessionStore
from services.llm_proxy.gateway.tokens import Context
from services.protocol import PlatformError, keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, token_digest
from services.protocol.trajectory import logprobs, token_ids
from services.runtime.redis_pool import open_redis


def _session(max_turns: int = 10) -> GatewaySession:
    return GatewaySession(
        session=secrets.token_hex(8), token_sha256=token_digest("t"), job="j", trajectory_id="t", attempt=1,
        pool="default", expires_at=time.time() + 300, max_turns=max_turns, max_tokens_per_turn=8,
        max_trajectory_tokens=999,
    )  # fmt: skip


def _call(index: int, prompt: list[int], output: list[int], *, merged: bool, segment: int = 0) -> GatewayCall:
    return GatewayCall(
        index=index, segment=segment, prompt_ids=token_ids(prompt), output_ids=token_ids(output),
        output_logprobs=logprobs([0.0] * len(output)), finish_reason="stop", merged=merged,
    )  # fmt: skip


def _context(text: str, segment: int = 0) -> Context:
    return Context(messages=[{"role": "user", "content": text}], reply={"role": "assistant", "content": "ok"},
                   tools=None, segment=segment, held=[], ended_with_eos=True)  # fmt: skip


async def test_a_copy_is_trusted_for_the_next_call_and_the_record_checks_it(redis_url: str) -> None:
    here, there = SessionStore(open_redis(redis_url)), SessionStore(open_redis(redis_url))
    session = _session()
    sid = session.session
    try:
        here.known.saw_new(sid)  # as ``authorize`` does when it first reads a session
        assert here.trusted(session, 1, 0) is None  # an assistant turn already: not the first call
        here.known.saw_new(sid)
        first = here.trusted(session, 0, 0)
        assert first is not None and (first.index, first.segments, first.last) == (0, 0, None)
        done = await here.record(session, _call(0, [1, 2], [3, 4], merged=False), _context("a"), mismatch=False,
                                 assistants=1)  # fmt: skip
        assert done == Recorded("recorded", 1, 1)

        view = here.trusted(session, 1, 0)  # the copy's messages and its reply: one assistant turn
        from_redis = await there.read(session)  # what another process reads
        assert view is not None and (view.index, view.segments) == (1, 1)
        assert view.last == from_redis.last and view.last is not None
        assert view.last.held == [1, 2, 3, 4] and view.last.messages == [{"role": "user", "content": "a"}]
        assert here.trusted(session, 2, 0) is None  # a reply this process did not give: its copy may be stale

        # another process records a call: the copy is not the last call any more
        other = await there.record(session, _call(1, [1, 2, 3, 4, 5], [6], merged=True), _context("b"),
                                   mismatch=False)  # fmt: skip
        assert other == Recorded("recorded", 2, 1)
        stale = here.trusted(session, 1, 0)
        assert stale is not None and stale.index == 1
        moved = await here.record(session, _call(1, [1, 2, 3, 4, 9], [9], merged=True), _context("c"),
                                  mismatch=False)  # fmt: skip
        assert moved == Recorded("moved", 2, 1)  # nothing written
        assert here.trusted(session, 1, 0) is None  # the copy is gone
        read = await here.read(session)
        assert (read.index, read.segments) == (2, 1) and read.last is not None
        assert read.last.held == [1, 2, 3, 4, 5, 6] and read.last.messages == [{"role": "user", "content": "b"}]
        again = await here.record(session, _call(2, [1, 2, 3, 4, 9], [9], merged=False, segment=1),
                                  _context("c", 1), mismatch=False)  # fmt: skip
        assert again == Recorded("recorded", 3, 2)
        raw: list[Any] = await here.redis.lrange(keys.gateway_calls(sid), 0, -1)
        assert [(c.index, c.segment, c.merged) for c in map(decode_call, raw)] == [(0, 0, False), (1, 0, True),
                                                                                  (2, 1, False)]  # fmt: skip
    finally:
        here.close()
        await here.redis.aclose(close_connection_pool=True)
        there.close()
        await there.redis.aclose(close_connection_pool=True)


async def test_a_closed_session_and_the_turn_cap_refuse_the_record(redis_url: str) -> None:
    store = SessionStore(open_redis(redis_url))
    try:
        session = _session(max_turns=1)
        first = await store.record(session, _call(0, [1], [2], merged=False), _context("a"), mismatch=False)
        assert first.outcome == "recorded"
        refused = await store.record(session, _call(1, [1, 2, 3], [4], merged=True), _context("b"), mismatch=False)
        assert refused == Recorded("turn_cap", 1)
        state = await store.redis.hgetall(keys.gateway_state(session.session))
        assert state[b"truncated"] == b"turns"

        closed = _session()
        await store.redis.hset(keys.gateway_state(closed.session), "closed", 1)  # as the worker closes it
        with pytest.raises(PlatformError, match="has ended") as refused_closed:
            await store.record(closed, _call(0, [1], [2], merged=False), _context("a"), mismatch=False)
        assert refused_closed.value.status == 404
        assert await store.redis.llen(keys.gateway_calls(closed.session)) == 0
    finally:
        store.close()
        await store.redis.aclose(close_connection_pool=True)


def test_a_session_not_seen_new_is_not_trusted_and_the_cache_is_bounded_in_bytes() -> None:
    cache = KnownSessions(max_bytes=100)
    assert cache.get("s") is None and not cache.fresh("s")  # neither recorded here nor just authorised here
    cache.saw_new("s")
    assert cache.fresh("s") and not cache.fresh("s")  # once only

    def known(index: int, tokens: int, expires_at: float = time.time() + 60) -> Known:
        call = _call(index, [7] * tokens, [], merged=False)
        return Known(index + 1, 1, _context("x"), call, expires_at, assistants=1, connection=0, doc_bytes=2)

    cache.put("a", known(0, 10))  # 42 bytes
    cache.put("b", known(0, 10))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("c", known(0, 10))  # 126 > 100: b, the least recently used, goes
    assert cache.get("b") is None and cache.get("c") is not None and cache.bytes == 84
    cache.put("a", known(1, 10))  # a replaced, not added
    assert cache.bytes == 84 and len(cache) == 2
    found = cache.get("a")
    assert found is not None and found.recorded == 2
    cache.put("big", known(0, 100))  # larger than the whole cache: not kept
    assert cache.get("big") is None and len(cache) == 2
    cache.put("old", known(0, 1, expires_at=time.time() - 1))
    assert cache.get("old") is None  # the session has ended


def test_a_raw_prompt_trusts_the_copy_over_its_own_connection_only() -> None:
    copy = Known(1, 1, _context("x"), _call(0, [1], [2], merged=False), time.time() + 60, None, 7, 2)
    assert copy.is_next(None, 7) and not copy.is_next(None, 8)
    chat = Known(1, 1, _context("x"), _call(0, [1], [2], merged=False), time.time() + 60, 3, 7, 2)
    assert chat.is_next(3, 8) and not chat.is_next(4, 7)

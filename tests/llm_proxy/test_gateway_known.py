"""A proxy process's copy of each session's last recorded call (``gateway/known.py``): used only when
Redis confirms it, bounded in bytes. Real Redis; two stores stand for two proxy processes."""

from __future__ import annotations

import secrets
import time

from services.llm_proxy.gateway.known import NO_CALL, Known, KnownSessions
from services.llm_proxy.gateway.sessions import SessionStore
from services.llm_proxy.gateway.tokens import Context
from services.protocol.gateway import GatewayCall, GatewaySession, token_digest
from services.protocol.trajectory import logprobs, token_ids
from services.runtime.redis_pool import open_redis


def _session() -> GatewaySession:
    return GatewaySession(
        session=secrets.token_hex(8), token_sha256=token_digest("t"), job="j", trajectory_id="t", attempt=1,
        pool="default", expires_at=time.time() + 300, max_turns=10, max_tokens_per_turn=8, max_trajectory_tokens=999,
    )  # fmt: skip


def _call(index: int, prompt: list[int], output: list[int], *, merged: bool) -> GatewayCall:
    return GatewayCall(
        index=index, segment=0, prompt_ids=token_ids(prompt), output_ids=token_ids(output),
        output_logprobs=logprobs([0.0] * len(output)), finish_reason="stop", merged=merged,
    )  # fmt: skip


def _context(text: str) -> Context:
    return Context(messages=[{"role": "user", "content": text}], reply={"role": "assistant", "content": "ok"},
                   tools=None, segment=0, held=[], ended_with_eos=True)  # fmt: skip


async def test_open_call_uses_the_process_copy_only_when_redis_confirms_it(redis_url: str) -> None:
    here, there = SessionStore(open_redis(redis_url)), SessionStore(open_redis(redis_url))
    session = _session()
    try:
        here.known.saw_new(session.session)  # as ``authorize`` does when it first reads a session
        first = here.guess(session)
        assert first is not None and first[0].expect == NO_CALL
        view = await here.open_call(session, first)
        assert view.guessed and view.last is None and (view.index, view.segments) == (0, 0)
        await here.record(session, _call(0, [1, 2], [3, 4], merged=False), _context("a"), mismatch=False)

        guess = here.guess(session)
        assert guess is not None and guess[0].expect == "0"
        view = await here.open_call(session, guess)
        from_redis = await there.open_call(session, None)  # what another process reads
        assert view.guessed and (view.index, view.segments) == (1, 1)
        assert not from_redis.guessed and view.last == from_redis.last and view.last is not None
        assert view.last.held == [1, 2, 3, 4] and view.last.messages == [{"role": "user", "content": "a"}]

        # another process records a call: this process's copy is no longer the last call
        await there.record(session, _call(2, [1, 2, 3, 4, 5], [6], merged=True), _context("b"), mismatch=False)
        stale = here.guess(session)
        assert stale is not None and stale[0].expect == "0"
        view = await here.open_call(session, stale)
        assert not view.guessed and view.last is not None
        assert view.last.held == [1, 2, 3, 4, 5, 6] and view.last.messages == [{"role": "user", "content": "b"}]
        assert view.recorded == 2
    finally:
        await here.redis.aclose(close_connection_pool=True)
        await there.redis.aclose(close_connection_pool=True)


def test_a_session_not_seen_new_is_not_guessed_and_the_cache_is_bounded_in_bytes() -> None:
    cache = KnownSessions(max_bytes=100)
    assert cache.guess("s") is None  # neither recorded here nor just authorised here
    cache.saw_new("s")
    guess = cache.guess("s")
    assert guess is not None and guess.expect == NO_CALL and cache.guess("s") is None  # once only

    def known(index: int, tokens: int, expires_at: float = time.time() + 60) -> Known:
        return Known(index, 1, b"{}", _call(index, [7] * tokens, [], merged=False), expires_at)

    cache.put("a", known(0, 10))  # 42 bytes
    cache.put("b", known(0, 10))
    assert cache.guess("a") is not None  # a is now the most recently used
    cache.put("c", known(0, 10))  # 126 > 100: b, the least recently used, goes
    assert cache.guess("b") is None and cache.guess("c") is not None and cache.bytes == 84
    cache.put("a", known(1, 10))  # a replaced, not added
    assert cache.bytes == 84 and len(cache) == 2
    guess = cache.guess("a")
    assert guess is not None and guess.expect == "1"
    cache.put("big", known(0, 100))  # larger than the whole cache: not kept
    assert cache.guess("big") is None and len(cache) == 2
    cache.put("old", known(0, 1, expires_at=time.time() - 1))
    assert cache.guess("old") is None  # the session has ended

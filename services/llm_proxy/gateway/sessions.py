"""Gateway sessions in Redis: authorisation, the session's counters and context, the call log.

The worker writes the session record (``keys.gateway_session``) with the episode's expiry; every
proxy process reads it (cached until it expires) and checks the token against its digest.
Per call: one script to read (counters, context, last call) and one to write (call record,
counters, context), each a single command (EVALSHA, loaded again after a NOSCRIPT). The read
sends the context and last call only when the process's own copy of them (``known.py``) is not
the session's last recorded call. Calls of one session are expected one at a time (agents wait for each answer);
concurrent calls each get their own index and may start their own segments.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from services.llm_proxy.gateway.known import Guess, Known, KnownSessions
from services.llm_proxy.gateway.tokens import Context
from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, encode_call, token_digest
from services.runtime.lua import LuaScript

OPEN = LuaScript(  # the context and last call are sent only when the caller's guess is not the last call
    keys=("state", "calls", "context"),
    args=("expect",),
    body="""
local index = redis.call('HINCRBY', state, 'next', 1)
local s = redis.call('HMGET', state, 'segments', 'truncated', 'closed', 'last')
local recorded = redis.call('LLEN', calls)
if expect ~= '-' and (s[4] or '') == expect then
  return {index, s[1], s[2], s[3], recorded, false, false, 1}
end
return {index, s[1], s[2], s[3], recorded, redis.call('GET', context), redis.call('LINDEX', calls, -1), 0}
""",
)

RECORD = LuaScript(  # no MULTI/EXEC needed, but a script is one command: all of it or none
    keys=("state", "calls", "context"),
    args=("call", "index", "doc", "ttl", "mismatch", "merged"),
    body="""
redis.call('RPUSH', calls, call)
redis.call('HSET', state, 'last', index)
redis.call('SET', context, doc, 'EX', ttl)
if mismatch == '1' then redis.call('HINCRBY', state, 'mismatches', 1) end
if merged == '0' then
  redis.call('HINCRBY', state, 'segments', 1)
  redis.call('EXPIRE', calls, ttl)
  redis.call('EXPIRE', state, ttl)
end
return redis.call('HGET', state, 'segments')
""",
)


@dataclass(slots=True)
class SessionView:
    """What one call reads: the session, its counters and the last call's context."""

    session: GatewaySession
    index: int  # this call's index
    recorded: int  # calls recorded before it
    segments: int  # segments opened so far
    truncated: str | None
    last: Context | None
    guessed: bool = False  # Redis confirmed the caller's guess: ``last`` is the process's own copy


def request_token(headers: Any) -> str | None:
    """``Authorization: Bearer <token>`` (OpenAI, Anthropic >= 2.0) or ``x-api-key`` (Anthropic < 2.0)."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return str(auth[7:].strip())
    key = headers.get("x-api-key")
    return None if key is None else str(key)


class SessionStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._cache: dict[str, GatewaySession] = {}
        self._open = OPEN.register(redis)
        self._record = RECORD.register(redis)
        self.known = KnownSessions()

    async def authorize(self, sid: str, token: str | None) -> GatewaySession:
        session = self._cache.get(sid)
        if session is None:
            raw = await self.redis.get(keys.gateway_session(sid))
            if raw is None:
                raise PlatformError(ErrorCode.NOT_FOUND, f"no gateway session {sid!r} (unknown or ended)")
            session = GatewaySession.model_validate_json(raw)
            self._cache[sid] = session
            self.known.saw_new(sid)
        if session.expires_at < time.time():
            self._cache.pop(sid, None)
            raise PlatformError(ErrorCode.NOT_FOUND, f"gateway session {sid!r} has ended")
        if token is None or not hmac.compare_digest(token_digest(token), session.token_sha256):
            raise PlatformError(ErrorCode.UNAUTHORIZED, "a valid session key is required (Bearer or x-api-key)")
        return session

    def guess(self, session: GatewaySession) -> tuple[Guess, Context | None] | None:
        """What this process expects ``open_call`` to find (None: no guess), with the last call's
        context built from its copy exactly as from what Redis would send."""
        guess = self.known.guess(session.session)
        if guess is None:
            return None
        known = guess.known
        return guess, None if known is None else _context(orjson.loads(known.context), known.call)

    async def open_call(self, session: GatewaySession, guess: tuple[Guess, Context | None] | None) -> SessionView:
        """The call's index and the session's state; the last call's context is read from Redis
        unless Redis confirms ``guess`` (its last recorded call is the guessed one)."""
        sid = session.session
        reply = await self._open(_keys(sid), {"expect": "-" if guess is None else guess[0].expect})
        index, segments, truncated, closed, recorded, context, last_raw, guessed = reply
        if closed:
            raise PlatformError(ErrorCode.NOT_FOUND, f"gateway session {sid!r} has ended")
        last = None
        if guess is not None and guessed:
            last = guess[1]
        elif context is not None and last_raw is not None:
            last = _context(orjson.loads(context), decode_call(last_raw))
        trunc = truncated.decode() if truncated else None
        view = SessionView(session, int(index) - 1, int(recorded), int(segments or 0), trunc, last, bool(guessed))
        return view

    async def mark_truncated(self, session: GatewaySession, cap: str) -> None:
        await self.redis.hsetnx(keys.gateway_state(session.session), "truncated", cap)

    async def record(self, session: GatewaySession, call: GatewayCall, context: Context, *, mismatch: bool) -> None:
        """One command: the call's index is already taken, so the write cannot clash with another call;
        the keys' expiry (which never moves) is set by each call that opens a segment (a merged call
        follows a recorded one, which set it). This process keeps a copy for the session's next call."""
        sid = session.session
        ttl = max(1, int(session.expires_at - time.time()) + 60)
        doc = orjson.dumps(context.to_json())
        flags = {"mismatch": int(mismatch), "merged": int(call.merged)}
        args = {"call": encode_call(call), "index": call.index, "doc": doc, "ttl": ttl, **flags}
        try:
            segments = await self._record(_keys(sid), args)
        except BaseException:
            self.known.drop(sid)
            raise
        self.known.put(sid, Known(call.index, int(segments or 0), doc, call, session.expires_at))


def _keys(sid: str) -> dict[str, str]:
    return {"state": keys.gateway_state(sid), "calls": keys.gateway_calls(sid), "context": keys.gateway_context(sid)}


def _context(doc: dict[str, Any], last: GatewayCall) -> Context:
    held = [*last.prompt_ids, *last.output_ids]
    return Context(
        messages=doc["messages"],
        reply=doc.get("reply"),
        tools=doc.get("tools"),
        segment=int(doc["segment"]),
        held=held,
        ended_with_eos=bool(doc.get("eos")),
        output_ids=list(last.output_ids),
    )

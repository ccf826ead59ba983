"""Gateway sessions in Redis: authorisation, the session's counters and context, the call log.

The worker writes the session record (``keys.gateway_session``) with the episode's expiry; every
proxy process reads it (cached until it expires) and checks the token against its digest.
Per call: one script to read (counters, context, last call) and one to write (call record,
counters, context), each a single command (EVALSHA; redis-py loads the script again after a
NOSCRIPT). Calls of one session are expected one at a time (agents wait for each answer);
concurrent calls each get their own index and may start their own segments.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from services.llm_proxy.gateway.tokens import Context
from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, encode_call, token_digest
from services.runtime.lua import LuaScript

OPEN = LuaScript(
    keys=("state", "calls", "context"),
    args=(),
    body="""
local index = redis.call('HINCRBY', state, 'next', 1)
local s = redis.call('HMGET', state, 'segments', 'truncated', 'closed')
return {index, s[1], s[2], s[3], redis.call('LLEN', calls), redis.call('GET', context), redis.call('LINDEX', calls, -1)}
""",
)

RECORD = LuaScript(  # no MULTI/EXEC needed, but a script is one command: all of it or none
    keys=("state", "calls", "context"),
    args=("call", "doc", "ttl", "mismatch", "merged"),
    body="""
redis.call('RPUSH', calls, call)
redis.call('SET', context, doc, 'EX', ttl)
if mismatch == '1' then redis.call('HINCRBY', state, 'mismatches', 1) end
if merged == '0' then
  redis.call('HINCRBY', state, 'segments', 1)
  redis.call('EXPIRE', calls, ttl)
  redis.call('EXPIRE', state, ttl)
end
return 1
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

    async def authorize(self, sid: str, token: str | None) -> GatewaySession:
        session = self._cache.get(sid)
        if session is None:
            raw = await self.redis.get(keys.gateway_session(sid))
            if raw is None:
                raise PlatformError(ErrorCode.NOT_FOUND, f"no gateway session {sid!r} (unknown or ended)")
            session = GatewaySession.model_validate_json(raw)
            self._cache[sid] = session
        if session.expires_at < time.time():
            self._cache.pop(sid, None)
            raise PlatformError(ErrorCode.NOT_FOUND, f"gateway session {sid!r} has ended")
        if token is None or not hmac.compare_digest(token_digest(token), session.token_sha256):
            raise PlatformError(ErrorCode.UNAUTHORIZED, "a valid session key is required (Bearer or x-api-key)")
        return session

    async def open_call(self, session: GatewaySession) -> SessionView:
        sid = session.session
        reply = await self._open(_keys(sid), {})
        index, segments, truncated, closed, recorded, context, last_raw = reply
        if closed:
            raise PlatformError(ErrorCode.NOT_FOUND, f"gateway session {sid!r} has ended")
        last = None
        if context is not None and last_raw is not None:
            last = _context(orjson.loads(context), decode_call(last_raw))
        return SessionView(
            session, int(index) - 1, int(recorded), int(segments or 0), truncated.decode() if truncated else None, last
        )

    async def mark_truncated(self, session: GatewaySession, cap: str) -> None:
        await self.redis.hsetnx(keys.gateway_state(session.session), "truncated", cap)

    async def record(self, session: GatewaySession, call: GatewayCall, context: Context, *, mismatch: bool) -> None:
        """One command: the call's index is already taken, so the write cannot clash with another call;
        the keys' expiry (which never moves) is set by each call that opens a segment (a merged call
        follows a recorded one, which set it)."""
        ttl = max(1, int(session.expires_at - time.time()) + 60)
        doc = orjson.dumps(context.to_json())
        flags = {"mismatch": int(mismatch), "merged": int(call.merged)}
        await self._record(_keys(session.session), {"call": encode_call(call), "doc": doc, "ttl": ttl, **flags})


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

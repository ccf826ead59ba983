"""Gateway sessions in Redis: authorisation, the session's counters and context, the call log.

The worker writes the session record (``keys.gateway_session``) with the episode's expiry; every
proxy process reads it (cached until it expires) and checks the token against its digest.

Per call, one command records it (``RECORD``, a script run by EVALSHA, loaded again after a
NOSCRIPT): the call, the context its successor is planned from, the counters. A call's index is
its place in the log, claimed by the record: the record is written only when the log still has
the length the call was planned at (so a merged call extends the session's last call, and no two
calls share an index or a new segment's number); otherwise nothing is written and the caller
records it again at the log's end as a new segment (``Turns``). The record also refuses a closed
session (the worker closes it in one transaction with reading the log, so a call recorded after
that read is never answered: the worker misses no answered call) and a call past the turn cap.

The session is read (``READ``: counters, context, last call) before a call is planned only when
this process has no trusted copy of its last call (``known.py``): a prefix-extending agent whose
calls come to one process costs one command per call.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
from redis.asyncio import Redis

from services.llm_proxy.gateway.known import Known, KnownSessions
from services.llm_proxy.gateway.tokens import Context
from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, encode_call, token_digest
from services.runtime.lua import LuaScript, Script
from services.runtime.redis_pipeline import pipelined

READ = LuaScript(  # the context and last call are sent only when the log's length is not the caller's copy's
    keys=("state", "calls", "context"),
    args=("expect",),
    body="""
local s = redis.call('HMGET', state, 'segments', 'closed')
local recorded = redis.call('LLEN', calls)
if tostring(recorded) == expect then
  return {recorded, s[1], s[2], false, false}
end
return {recorded, s[1], s[2], redis.call('GET', context), redis.call('LINDEX', calls, -1)}
""",
)

RECORDED, MOVED, CLOSED, TURN_CAP = 0, 1, 2, 3  # RECORD's outcomes

RECORD = LuaScript(  # no MULTI/EXEC needed, but a script is one command: all of it or none
    keys=("state", "calls", "context"),
    args=("call", "index", "doc", "ttl", "mismatch", "merged", "max_turns"),
    body="""
local s = redis.call('HMGET', state, 'segments', 'closed')
if s[2] then return {2} end
local recorded = redis.call('LLEN', calls)
if recorded >= tonumber(max_turns) then
  redis.call('HSETNX', state, 'truncated', 'turns')
  return {3, recorded}
end
local segments = tonumber(s[1] or '0')
if recorded ~= tonumber(index) then return {1, recorded, segments} end
redis.call('RPUSH', calls, call)
redis.call('SET', context, doc, 'EX', ttl)
if mismatch == '1' then redis.call('HINCRBY', state, 'mismatches', 1) end
if merged == '0' then
  segments = redis.call('HINCRBY', state, 'segments', 1)
  redis.call('EXPIRE', calls, ttl)
  redis.call('EXPIRE', state, ttl)
end
return {0, recorded + 1, segments}
""",
)


@dataclass(slots=True)
class SessionView:
    """What a call is planned from: the session's log length and segments, the last call's context."""

    session: GatewaySession
    recorded: int  # calls in the log: the index this call is recorded at unless the log moves on
    segments: int  # segments opened so far (a new segment gets this number)
    last: Context | None

    @property
    def index(self) -> int:
        return self.recorded


@dataclass(frozen=True, slots=True)
class Recorded:
    """What ``record`` did: ``recorded`` the call (the log now has ``length`` calls), or found the log
    ``moved`` on to ``length`` calls and ``segments`` segments (nothing written), or refused it at the
    turn cap (``length`` calls recorded; the session is marked truncated)."""

    outcome: Literal["recorded", "moved", "turn_cap"]
    length: int
    segments: int = 0


def request_token(headers: Any) -> str | None:
    """``Authorization: Bearer <token>`` (OpenAI, Anthropic >= 2.0), ``x-api-key`` (Anthropic < 2.0)
    or ``x-goog-api-key`` (Gemini)."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return str(auth[7:].strip())
    key = headers.get("x-api-key") or headers.get("x-goog-api-key")
    return None if key is None else str(key)


class SessionStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._cache: dict[str, GatewaySession] = {}
        self.link = pipelined(redis)  # the per-call scripts' connection (None: they use ``redis``)
        self._read: Script = READ.register(redis) if self.link is None else READ.pipelined(self.link)
        self._record: Script = RECORD.register(redis) if self.link is None else RECORD.pipelined(self.link)
        self.known = KnownSessions()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

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

    def trusted(self, session: GatewaySession, assistants: int | None, connection: int) -> SessionView | None:
        """The view from this process's copy when the call looks like the session's next call after
        it (``Known.is_next``), or like its first when the session was just authorised here; else None
        (read it). The record checks the guess."""
        sid = session.session
        known = self.known.get(sid)
        if known is not None:
            if not known.is_next(assistants, connection):
                return None
            return SessionView(session, known.recorded, known.segments, known.last())
        if self.known.fresh(sid) and not assistants:
            return SessionView(session, 0, 0, None)
        return None

    async def read(self, session: GatewaySession) -> SessionView:
        """The session's log length, segments and last call's context, from Redis (the context from
        this process's copy when that is still the last call)."""
        sid = session.session
        known = self.known.get(sid)
        reply = await self._read(_keys(sid), {"expect": "-" if known is None else str(known.recorded)})
        recorded, segments, closed, context, last_raw = reply
        if closed:
            raise PlatformError(ErrorCode.NOT_FOUND, f"gateway session {sid!r} has ended")
        last = None
        if known is not None and int(recorded) == known.recorded:
            last = known.last()
        elif context is not None and last_raw is not None:
            last = _context(orjson.loads(context), decode_call(last_raw))
        return SessionView(session, int(recorded), int(segments or 0), last)

    async def mark_truncated(self, session: GatewaySession, cap: str) -> None:
        await self.redis.hsetnx(keys.gateway_state(session.session), "truncated", cap)

    def record(
        self, session: GatewaySession, call: GatewayCall, context: Context, *, mismatch: bool,
        assistants: int | None = None, connection: int = 0,
    ) -> Awaitable[Recorded]:  # fmt: skip
        """Send the one command that records ``call`` at index ``call.index`` if the log still has that
        many calls (see the module's docstring); await the result for the outcome. The keys' expiry
        (which never moves) is set by each call that opens a segment. This process keeps a copy of
        a recorded call for the session's next call."""
        sid = session.session
        ttl = max(1, int(session.expires_at - time.time()) + 60)
        doc = orjson.dumps(context.to_json())
        flags = {"mismatch": int(mismatch), "merged": int(call.merged), "max_turns": session.max_turns}
        args = {"call": encode_call(call), "index": call.index, "doc": doc, "ttl": ttl, **flags}
        try:
            sent = self._record.send(_keys(sid), args)
        except BaseException:
            self.known.drop(sid)
            raise
        kept = Known(call.index + 1, 0, context, call, session.expires_at, assistants, connection, len(doc))
        return self._recorded(session, sent, kept)

    async def _recorded(self, session: GatewaySession, sent: Awaitable[Any], kept: Known) -> Recorded:
        sid = session.session
        try:
            reply = await sent
        except BaseException:
            self.known.drop(sid)
            raise
        outcome = int(reply[0])
        if outcome == CLOSED:
            self.known.drop(sid)
            raise PlatformError(ErrorCode.NOT_FOUND, f"gateway session {sid!r} has ended")
        if outcome == TURN_CAP:
            return Recorded("turn_cap", int(reply[1]))
        length, segments = int(reply[1]), int(reply[2])
        if outcome == MOVED:
            self.known.drop(sid)  # the copy is not the last call any more
            return Recorded("moved", length, segments)
        self.known.put(sid, replace(kept, recorded=length, segments=segments))
        return Recorded("recorded", length, segments)


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

"""What this proxy process recorded last for each gateway session, so that the session's next call
can be planned (and its engine call made) without reading the session from Redis first.

A copy is only trusted, never relied on: the call is recorded on the condition that the session's
log still has the length the copy says (``sessions.RECORD``: the record and the check are one
command). When another call was recorded meanwhile (by another process, or concurrently), the
call is recorded at the log's end as the start of a new segment: its prompt ids are exactly what
the engine was sent, so it is token-exact either way; it only does not merge.

A copy is trusted when the call looks like the session's next call after it: for chat routes, the
messages hold as many assistant turns as the copy's messages plus its reply (a copy is stale when
calls of the session were answered elsewhere, and the agent's history then holds their replies
too); for ``/v1/completions``, the call came over the connection the copy's call came over. Other
calls read the session from Redis first (``SessionStore.read``).

The cache is bounded in bytes (``MAX_BYTES`` per process, least recently used first out); a
session that is not in it is simply read from Redis, as without a cache.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from services.llm_proxy.gateway.tokens import Context
from services.protocol.gateway import GatewayCall

MAX_BYTES = 32 * 1024 * 1024  # per proxy process: the recorded ids (4 bytes per token) and context documents
MAX_NEW = 65_536  # sessions remembered as just authorised (a bound on a set of ids)


@dataclass(frozen=True, slots=True)
class Known:
    """The last call this process recorded for a session, as written to Redis."""

    recorded: int  # calls in the session's log after the record (this one is the last)
    segments: int  # the session's segment counter after that record
    context: Context  # as written beside the call, without the ids (``last`` adds them)
    call: GatewayCall
    expires_at: float  # the session's
    assistants: int | None  # assistant turns in the call's messages and reply (None: not a chat route)
    connection: int  # the id of the connection the call came over
    doc_bytes: int  # the size of the context document written to Redis

    @property
    def size(self) -> int:
        return self.doc_bytes + 4 * (len(self.call.prompt_ids) + len(self.call.output_ids))

    def last(self) -> Context:
        """The context of the call, exactly as ``SessionStore.read`` builds it from Redis."""
        call = self.call
        return replace(self.context, held=[*call.prompt_ids, *call.output_ids], output_ids=list(call.output_ids))

    def is_next(self, assistants: int | None, connection: int) -> bool:
        """Whether a call with ``assistants`` assistant turns (None: not a chat route) over
        ``connection`` looks like the session's next call after this one."""
        if assistants is None or self.assistants is None:
            return connection == self.connection
        return assistants == self.assistants


class KnownSessions:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Known] = OrderedDict()
        self._bytes = 0
        self._new: set[str] = set()  # sessions this process has just read the record of (no call seen yet)

    def saw_new(self, sid: str) -> None:
        """The process read the session's record for the first time: its first call here is likely
        the session's first call."""
        if len(self._new) >= MAX_NEW:  # sessions authorised but never called here: forget them
            self._new.clear()
        self._new.add(sid)

    def get(self, sid: str) -> Known | None:
        known = self._entries.get(sid)
        if known is None:
            return None
        if known.expires_at <= time.time():
            self.drop(sid)
            return None
        self._entries.move_to_end(sid)
        return known

    def fresh(self, sid: str) -> bool:
        """Whether the session was just authorised here with no call seen yet (asked once)."""
        if sid in self._new:
            self._new.discard(sid)
            return True
        return False

    def put(self, sid: str, known: Known) -> None:
        self.drop(sid)
        self._new.discard(sid)
        if known.size > self.max_bytes:
            return
        self._entries[sid] = known
        self._bytes += known.size
        while self._bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size

    def drop(self, sid: str) -> None:
        old = self._entries.pop(sid, None)
        if old is not None:
            self._bytes -= old.size

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

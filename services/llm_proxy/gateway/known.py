"""What this proxy process recorded last for each gateway session, so that the session's next call
can be planned (and its engine call started) before Redis has answered ``open_call``.

A guess is only a guess: ``open_call`` sends it along, and Redis confirms it when the session's
last recorded call is still the one guessed (the record script notes each call's index in the
session's state, in the same command as the call itself). When it is not (another process
recorded a call of the session, the session was reset), the call is planned again from what Redis
holds and the early engine call is aborted. So the cache never changes an answer or a record; it
only moves the ``open_call`` round trip off a call's path when the session's calls come to the
same process, as an agent's calls over one keep-alive connection do.

The cache is bounded in bytes (``MAX_BYTES`` per process, least recently used first out); a
session that is not in it is simply read from Redis, as without a cache.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from services.protocol.gateway import GatewayCall

MAX_BYTES = 32 * 1024 * 1024  # per proxy process: the recorded ids (4 bytes per token) and context documents
MAX_NEW = 65_536  # sessions remembered as just authorised (a bound on a set of ids)
NO_CALL = ""  # the guess for a session with no call recorded yet


@dataclass(frozen=True, slots=True)
class Known:
    """The last call this process recorded for a session, as written to Redis."""

    index: int
    segments: int  # the session's segment counter after that record
    context: bytes  # the context document written beside the call
    call: GatewayCall
    expires_at: float  # the session's

    @property
    def size(self) -> int:
        return len(self.context) + 4 * (len(self.call.prompt_ids) + len(self.call.output_ids))


@dataclass(frozen=True, slots=True)
class Guess:
    """What a call expects ``open_call`` to find: the index of the session's last recorded call
    (``NO_CALL``: none yet) and, when there is one, the process's copy of it."""

    expect: str
    known: Known | None


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

    def guess(self, sid: str) -> Guess | None:
        known = self._entries.get(sid)
        if known is not None and known.expires_at > time.time():
            self._entries.move_to_end(sid)
            return Guess(str(known.index), known)
        if sid in self._new:
            self._new.discard(sid)
            return Guess(NO_CALL, None)
        return None

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

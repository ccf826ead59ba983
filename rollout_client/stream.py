"""The job's trajectory stream, read through a Redis consumer group: exactly once, resumable.

The platform appends every finished trajectory to the job's stream (``keys.trajectory_stream``).
A trainer reads it through a consumer group (``keys.TRAINERS_GROUP`` unless told otherwise):

- :meth:`TrajectoryConsumer.read` hands out entries never delivered to the group before;
- an entry stays *pending* until :meth:`~TrajectoryConsumer.ack`: acknowledge only once its fate
  is durable on the trainer's side (a checkpoint that recorded it used, or dropped), so a crash
  replays it instead of losing it;
- on start, :meth:`~TrajectoryConsumer.reclaim` claims every entry still pending in the group (read
  by a previous process, never acknowledged) with XAUTOCLAIM: that replay comes before new entries.

Together with a record of the ``attempt_key`` values already decided (the trainer's checkpoint),
every trajectory is trained on at most once and never lost. :class:`AsyncTrajectoryConsumer` is the
same over ``redis.asyncio``. An entry that does not decode comes back with ``trajectory`` None (to be
acknowledged as malformed, never retried forever).

A job that no longer exists while it is read (its stream or group gone: the store lost its state)
raises :class:`~rollout_client.errors.JobGone` from every call, instead of Redis's NOGROUP.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from rollout_client.errors import job_gone
from services.protocol import keys
from services.protocol.trajectory import Trajectory, from_stream_fields
from services.runtime.groups import ensure_group, ensure_group_async

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    entry_id: str
    trajectory: Trajectory | None  # None: the entry could not be decoded


class TrajectoryConsumer:
    """One consumer of a job's trajectory stream in a consumer group (a client with ``decode_responses=False``)."""

    def __init__(self, client: redis.Redis, job: str, group: str = keys.TRAINERS_GROUP, consumer: str = "trainer-0"):
        self.client = client  # decode_responses=False: bodies are binary
        self.job = job
        self.stream = keys.trajectory_stream(job)
        self.group = group
        self.consumer = consumer
        self.last_entry_id = "0-0"

    def ensure_group(self) -> None:
        """Create the consumer group at the start of the stream (idempotent)."""
        ensure_group(self.client, self.stream, self.group)

    def reclaim(self, batch: int = 500) -> list[Entry]:
        """Every pending entry of the group, claimed for this consumer (a restart's replay)."""
        out: list[Entry] = []
        cursor = "0-0"
        while True:
            with gone_if_missing(self.job):
                reply: Any = self.client.xautoclaim(self.stream, self.group, self.consumer, 0, cursor, count=batch)
            cursor = _text(reply[0])
            out += [self._entry(eid, fields) for eid, fields in reply[1] if fields is not None]
            if cursor == "0-0":
                break
        if out:
            logger.info("reclaimed %d pending entries from %s", len(out), self.stream)
        return out

    def read(self, count: int, block_ms: int) -> list[Entry]:
        """New entries (never delivered to the group before)."""
        with gone_if_missing(self.job):
            reply: Any = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count,
                                                block=block_ms)  # fmt: skip
        return [self._entry(eid, fields) for _, items in reply or [] for eid, fields in items]

    def ack(self, entry_ids: Iterable[str]) -> int:
        ids = list(entry_ids)
        if not ids:
            return 0
        return int(self.client.xack(self.stream, self.group, *ids))

    def pending_count(self) -> int:
        with gone_if_missing(self.job):
            return int(self.client.xpending(self.stream, self.group)["pending"])

    def _entry(self, entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
        entry = decode_entry(self.stream, entry_id, fields)
        self.last_entry_id = entry.entry_id
        return entry


class AsyncTrajectoryConsumer:
    """:class:`TrajectoryConsumer` over ``redis.asyncio`` (a client with ``decode_responses=False``)."""

    def __init__(
        self, client: redis.asyncio.Redis, job: str, group: str = keys.TRAINERS_GROUP, consumer: str = "trainer-0"
    ) -> None:
        self.client = client
        self.job = job
        self.stream = keys.trajectory_stream(job)
        self.group = group
        self.consumer = consumer
        self.last_entry_id = "0-0"

    async def ensure_group(self) -> None:
        await ensure_group_async(self.client, self.stream, self.group)

    async def reclaim(self, batch: int = 500) -> list[Entry]:
        out: list[Entry] = []
        cursor = "0-0"
        while True:
            with gone_if_missing(self.job):
                reply: Any = await self.client.xautoclaim(self.stream, self.group, self.consumer, 0, cursor,
                                                          count=batch)  # fmt: skip
            cursor = _text(reply[0])
            out += [self._entry(eid, fields) for eid, fields in reply[1] if fields is not None]
            if cursor == "0-0":
                return out

    async def read(self, count: int, block_ms: int) -> list[Entry]:
        with gone_if_missing(self.job):
            reply: Any = await self.client.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        return [self._entry(eid, fields) for _, items in reply or [] for eid, fields in items]

    async def ack(self, entry_ids: Iterable[str]) -> int:
        ids = list(entry_ids)
        return int(await self.client.xack(self.stream, self.group, *ids)) if ids else 0

    async def pending_count(self) -> int:
        with gone_if_missing(self.job):
            return int((await self.client.xpending(self.stream, self.group))["pending"])

    def _entry(self, entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
        entry = decode_entry(self.stream, entry_id, fields)
        self.last_entry_id = entry.entry_id
        return entry


# Redis's answers for a stream or group that is not there: NOGROUP (read, claim, pending), and the
# error that unblocks a reader blocked on a stream deleted under it
_MISSING = ("NOGROUP", "no longer exists")


@contextlib.contextmanager
def gone_if_missing(job: str) -> Iterator[None]:
    """Turn Redis's "no such stream or group" into :class:`~rollout_client.errors.JobGone`."""
    try:
        yield
    except redis.ResponseError as exc:
        if any(marker in str(exc) for marker in _MISSING):
            raise job_gone(job, f"its trajectory stream or consumer group is gone: {exc}") from exc
        raise


def decode_entry(stream: str, entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
    """One stream entry; ``trajectory`` None (logged) when its body does not decode."""
    eid = _text(entry_id)
    try:
        return Entry(eid, from_stream_fields(fields))
    except Exception:
        logger.exception("undecodable trajectory entry %s in %s", eid, stream)
        return Entry(eid, None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

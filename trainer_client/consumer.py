"""The job's trajectory stream, read through a consumer group.

Entries are acknowledged only after the checkpoint that recorded their fate (used in a step, or
dropped), so a crash replays them. On start, every entry still pending in the group (read by a
previous trainer process but never acknowledged) is reclaimed with XAUTOCLAIM before new
entries are read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from services.protocol import keys
from services.protocol.trajectory import Trajectory, from_stream_fields
from services.runtime.groups import ensure_group

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    entry_id: str
    trajectory: Trajectory | None  # None: the entry could not be decoded


class TrajectoryConsumer:
    def __init__(self, client: redis.Redis, job: str, group: str = keys.TRAINERS_GROUP, consumer: str = "trainer-0"):
        self.client = client  # decode_responses=False: bodies are binary
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
        reply: Any = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        return [self._entry(eid, fields) for _, items in reply or [] for eid, fields in items]

    def ack(self, entry_ids: Iterable[str]) -> int:
        ids = list(entry_ids)
        if not ids:
            return 0
        return int(self.client.xack(self.stream, self.group, *ids))

    def pending_count(self) -> int:
        return int(self.client.xpending(self.stream, self.group)["pending"])

    def _entry(self, entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
        eid = _text(entry_id)
        self.last_entry_id = eid
        try:
            return Entry(eid, from_stream_fields(fields))
        except Exception:
            logger.exception("undecodable trajectory entry %s in %s", eid, self.stream)
            return Entry(eid, None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

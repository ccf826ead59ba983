"""Trajectory summaries read from a job's stream without touching the token arrays.

A :class:`Summary` decodes only the small fields of the msgpack body (msgspec skips the rest), so
listing and filtering cost microseconds per entry even for 64K-token trajectories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.asyncio import Redis

from services.protocol import keys
from services.protocol.dashboard import Staleness, TrajectoryRow
from services.protocol.trajectory import ENTRY_BODY

PAGE = 200  # stream entries read per XREVRANGE


class _Turn(msgspec.Struct):
    weight_version: str = ""


class _Infra(msgspec.Struct):
    stage: str = ""


class _Timings(msgspec.Struct):
    total_s: float = 0.0


class Summary(msgspec.Struct):
    trajectory_id: str
    attempt: int
    rollout_id: str
    task_id: str
    status: str
    truncation: str | None = None
    reward: float | None = None
    infra: _Infra | None = None
    turns: list[_Turn] = []
    timings: _Timings = msgspec.field(default_factory=_Timings)
    finished_at: float = 0.0

    def versions(self) -> list[str]:
        return list(dict.fromkeys(t.weight_version for t in self.turns))

    def row(self, entry_id: str) -> TrajectoryRow:
        return TrajectoryRow(
            entry_id=entry_id, trajectory_id=self.trajectory_id, attempt=self.attempt, rollout_id=self.rollout_id,
            task_id=self.task_id, status=self.status, truncation=self.truncation,
            reward=None if self.status in ("infra_error", "cancelled") else self.reward, turns=len(self.turns),
            weight_versions=self.versions(), infra_stage=self.infra.stage if self.infra else None,
            total_s=self.timings.total_s, finished_at=self.finished_at,
        )  # fmt: skip


_DECODER = msgspec.msgpack.Decoder(Summary)
_BODY = ENTRY_BODY.encode()


def summary(fields: dict[bytes, bytes]) -> Summary:
    return _DECODER.decode(fields[_BODY])


@dataclass(frozen=True, slots=True)
class Filters:
    rollout: str | None = None
    status: str | None = None
    cap: str | None = None
    weight_version: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def match(self, s: Summary) -> bool:
        if (self.rollout and s.rollout_id != self.rollout) or (self.status and s.status != self.status):
            return False
        if (self.cap and s.truncation != self.cap) or (self.weight_version and self.weight_version not in s.versions()):
            return False
        trainable = s.status in ("completed", "truncated")
        if self.min_reward is not None and not (trainable and (s.reward or 0.0) >= self.min_reward):
            return False
        return self.max_reward is None or (trainable and (s.reward or 0.0) <= self.max_reward)


async def entries_before(redis: Redis, job: str, before: str | None, limit: int) -> AsyncIterator[tuple[str, Any]]:
    """The job's stream entries, newest first, strictly older than ``before``, at most ``limit``."""
    if before is not None:
        ms, _, seq = before.partition("-")
        if int(ms) == int(seq or 0) == 0:
            return  # nothing is older than the first possible id
        if int(ms) >= 2**64 or int(seq or 0) >= 2**64:
            before = None  # past every possible id: start from the newest
    stream, high, remaining = keys.trajectory_stream(job), f"({before}" if before else "+", limit
    while remaining > 0:
        count = min(PAGE, remaining)
        batch: Any = await redis.xrevrange(stream, max=high, min="-", count=count)
        for entry_id, fields in batch:
            yield entry_id.decode(), fields
        remaining -= len(batch)
        if len(batch) < count:
            return
        high = "(" + batch[-1][0].decode()


def weight_version_counts(summaries: Iterable[Summary]) -> dict[str, int]:
    counts: Counter[str] = Counter(t.weight_version for s in summaries for t in s.turns)
    return dict(sorted(counts.items(), key=lambda kv: _version_key(kv[0])))


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


def staleness(pool_version: str | None, consumed: list[Summary]) -> Staleness:
    """Versions between the pool's and the oldest turn of each consumed trajectory (integer versions only)."""
    gaps = []
    if pool_version is not None and pool_version.isdigit():
        for s in consumed:
            versions = [int(t.weight_version) for t in s.turns if t.weight_version.isdigit()]
            if versions:
                gaps.append(max(0, int(pool_version) - min(versions)))
    histogram = Counter(str(g) for g in gaps)
    return Staleness(
        pool_version=pool_version, sampled=len(gaps), mean=sum(gaps) / len(gaps) if gaps else None,
        max=max(gaps) if gaps else None, histogram=dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
    )  # fmt: skip

"""Work entries no worker can finish leave the work stream for the job's dead letters
(``keys.dead_letters``) instead of going round forever.

An entry goes there when it cannot be decoded (``work.UNDECODABLE``), when processing it failed
outside its attempts, in publishing or acknowledging it (``work.FAILED``), or when it was delivered
more than ``max_deliveries`` times, its earlier holders having died with it (``work.REDELIVERED``).
The dead letter keeps the entry's fields, the reason, the last error and the delivery count; the
entry is acknowledged and deleted in the same transaction and counted in
``rollout_worker_dead_letters_total{job,reason}``.

When the item can be decoded, its trajectory is also reported on its rollout, so the rollout
finishes and its trainer counts it: an ``infra_error`` record at stage ``worker`` (``cancelled``
when the rollout was cancelled), published once like every record. When that record cannot be
encoded either (what failed was the task's metadata), it is published without the metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis

from services.protocol import ErrorCode, InfraFailure, InfraStage, Status, Trajectory, WorkItem, keys, work
from services.protocol.keys import WORKERS_GROUP
from services.rollout_api.publishing import publish, trajectory_shell
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.worker.metrics import WorkerMetrics
from services.runtime.outages import STORE_ERRORS

log = logging.getLogger(__name__)
MAXLEN = 10_000  # XADD MAXLEN ~ of each job's dead letters


def first_line(error: BaseException | str, limit: int = 500) -> str:
    """An error as one short line (``repr`` of an exception with no message)."""
    text = error if isinstance(error, str) else (str(error) or repr(error))
    lines = text.strip().splitlines()
    return (lines[0] if lines else repr(error))[:limit]


class DeadLetters:
    """Moves entries of any job to its dead letters (one per worker)."""

    def __init__(self, redis: Redis, scripts: Scripts, metrics: WorkerMetrics, *, worker_id: str, maxlen: int) -> None:
        self.redis = redis
        self.scripts = scripts
        self.metrics = metrics
        self.worker_id = worker_id
        self.maxlen = maxlen  # of the trajectory streams, for the record reported on the rollout

    async def move(
        self, job: str, entry_id: str | bytes, fields: Mapping[bytes, bytes], reason: str, error: str,
        *, item: WorkItem | None = None,
    ) -> None:  # fmt: skip
        """Report ``item`` (when decoded) on its rollout, then copy the entry with ``reason`` and
        ``error`` to the dead letters, acknowledge and delete it. A Redis outage propagates: the
        entry then stays pending and is delivered again."""
        entry = entry_id.encode() if isinstance(entry_id, str) else entry_id
        stream = keys.work_stream(job)
        deliveries = await self.deliveries(job, entry)
        if item is not None:
            await self._report(item, reason, error)
        mapping: dict[Any, Any] = work.dead_letter_fields(fields, reason, entry, error=error, deliveries=deliveries)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(keys.dead_letters(job), mapping, maxlen=MAXLEN, approximate=True)
            pipe.xack(stream, WORKERS_GROUP, entry)
            pipe.xdel(stream, entry)
            await pipe.execute()
        self.metrics.dead_letters.labels(job, reason).inc()
        log.warning("work entry %s of job %s moved to the dead letters (%s, %d deliveries): %s", entry.decode(), job,
                    reason, deliveries, error)  # fmt: skip

    async def deliveries(self, job: str, entry_id: bytes) -> int:
        """How many times the entry was delivered (0 when it is not pending)."""
        pending: Any = await self.redis.xpending_range(
            keys.work_stream(job), WORKERS_GROUP, min=entry_id, max=entry_id, count=1
        )
        return int(pending[0]["times_delivered"]) if pending else 0

    async def _report(self, item: WorkItem, reason: str, error: str) -> None:
        attempt = int(await self.redis.hget(keys.attempts(item.job), item.trajectory_id) or 1)
        cancelled = await self.redis.hget(keys.rollout_record(item.job, item.rollout_id), "cancelled") == b"1"
        traj = trajectory_shell(item, max(1, attempt), Status.CANCELLED if cancelled else Status.INFRA_ERROR,
                                worker=self.worker_id)  # fmt: skip
        if not cancelled:
            message = f"moved to the dead letters ({reason}): {error}"
            traj.infra = InfraFailure(
                stage=InfraStage.WORKER, code=ErrorCode.INTERNAL_ERROR, message=message, attempts=max(1, attempt)
            )
        try:
            await self._publish(traj)
        except STORE_ERRORS:
            raise
        except Exception as exc:  # the record itself cannot be encoded: its metadata is the likely cause
            log.warning("%s: its record cannot be published (%s); publishing it without its metadata",
                        item.trajectory_id, first_line(exc))  # fmt: skip
            traj.metadata = {}
            await self._publish(traj)

    async def _publish(self, traj: Trajectory) -> None:
        if await publish(self.scripts, traj, maxlen=self.maxlen, ran=False) is not None:
            self.metrics.published.labels(traj.job, traj.status.value).inc()

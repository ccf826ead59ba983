"""The worker process: fills its episode slots from the jobs' work streams in fair-share order,
reclaims items of dead workers, heartbeats its own, watches for cancellations, and shuts down
gracefully."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.protocol import Task, WorkItem, keys, work
from services.protocol.keys import WORKERS_GROUP
from services.protocol.work import WorkEntry
from services.rollout_api.records import read_jobs
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.worker.agent import AgentDeps
from services.rollout_api.worker.dead_letters import first_line
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.outages import BROKER
from services.rollout_api.worker.runner import STOP_CANCELLED, STOP_SHUTDOWN, STOP_STORE_LOST, Delivery, ItemRunner
from services.rollout_api.worker.scheduler import FairShare
from services.runtime.generation import StoreGeneration
from services.runtime.groups import ensure_group_async
from services.runtime.outages import STORE_ERRORS, Outage

log = logging.getLogger(__name__)
TASK_CACHE = 1024  # parsed tasks kept per worker (a rollout's items share one)

Entry = tuple[bytes, dict[bytes, bytes]]


class Worker:
    def __init__(self, redis: Redis, deps: AgentDeps, metrics: WorkerMetrics) -> None:
        self.redis = redis
        self.deps = deps
        self.settings = deps.settings
        self.metrics = metrics
        self.name = deps.worker_id
        self.runner = ItemRunner(redis, Scripts(redis), deps, metrics)
        self.fair = FairShare()
        self.max_in_flight: dict[str, int] = {}
        self.running: dict[asyncio.Task[None], Delivery] = {}
        self.slot_freed = asyncio.Event()
        self.outage = Outage("Redis", log)  # every loop of this worker reports to it
        self.stopping = asyncio.Event()
        self._tasks: dict[tuple[str, str, str], Task] = {}  # (job, rollout, task id) -> the rollout's task
        self._next_reclaim = 0.0  # monotonic time of the next XAUTOCLAIM scan
        # jobs whose last scan stopped for want of free slots: reclaimable items may be left, so these
        # jobs are scanned every round and no new item of theirs is read until the scan gets through
        self.reclaim_backlog: set[str] = set()
        self.generation = StoreGeneration("worker")  # read with the job list: a store that lost its state is said
        self.renewing: dict[str, asyncio.Task[None]] = {}  # lease renewals in flight

    @property
    def free(self) -> int:
        return self.settings.concurrency - len(self.running)

    async def run(self) -> None:
        await self.refresh_jobs()
        loops = [
            self._every(self.settings.jobs_refresh_s, self.refresh_jobs),
            self._every(self.settings.heartbeat_s, self.heartbeat),
            self._every(self.settings.cancel_poll_s, self.watch_cancellations),
        ]
        background = [asyncio.create_task(loop) for loop in loops]
        try:
            await self._fill()
        finally:
            await self._drain()
            for task in [*background, *self.renewing.values()]:
                task.cancel()
            await asyncio.gather(*background, *self.renewing.values(), return_exceptions=True)

    def stop(self) -> None:
        self.stopping.set()

    async def _every(self, period_s: float, action: Callable[[], Awaitable[None]]) -> None:
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=period_s)
            except TimeoutError:
                pass
            if self.stopping.is_set():
                return
            try:
                await action()
            except STORE_ERRORS as exc:
                self.outage.failed(exc)
            except Exception:
                log.exception("%s failed; retrying in %.1fs", action.__name__, period_s)
            else:
                self.outage.ok()

    # -- taking work -------------------------------------------------------------------------

    async def refresh_jobs(self) -> None:
        if await self.generation.observe_async(self.redis):
            self.drop_running(STOP_STORE_LOST)
        records = await read_jobs(self.redis)
        if self.settings.jobs is not None:
            records = [r for r in records if r.job in self.settings.jobs]
        for record in records:
            if record.job not in self.fair.jobs:
                await ensure_group_async(self.redis, keys.work_stream(record.job), WORKERS_GROUP)
        self.fair.set_jobs({r.job: r.weight for r in records})
        self.reclaim_backlog &= set(self.fair.jobs)
        self.max_in_flight = {r.job: r.quotas.max_in_flight for r in records}

    async def _fill(self) -> None:
        idle_s = self.settings.poll_interval_s  # doubles while rounds find nothing, back on a take
        while not self.stopping.is_set():
            outages = self.deps.outages
            if outages is not None and not outages.all_up:  # a dependency is down: take nothing new
                await outages.wait_all_up(self.stopping)
                continue
            if self.free <= 0:
                self.slot_freed.clear()
                await self._wait(self.slot_freed, 1.0)
                continue
            try:
                took = await self._take_round()
                self.outage.ok()
            except STORE_ERRORS as exc:
                self.outage.failed(exc)
                took = 0
            except ResponseError as exc:
                if "NOGROUP" in str(exc):
                    await self._job_vanished()
                else:
                    log.exception("taking work failed")
                took = 0
            except Exception:
                log.exception("taking work failed")
                took = 0
            if took:
                idle_s = self.settings.poll_interval_s
            else:  # nothing to take (or every job at its quota): wait for a poll tick or a free slot
                self.slot_freed.clear()
                await self._wait(self.slot_freed, idle_s)
                idle_s = min(2 * idle_s, self.settings.poll_max_s)

    async def _job_vanished(self) -> None:
        """A job's work stream is gone (NOGROUP: the store lost its state): follow the job list now,
        which stops the vanished jobs' episodes, instead of a traceback per round until its refresh."""
        try:
            await self.refresh_jobs()
        except STORE_ERRORS as exc:
            self.outage.failed(exc)

    async def _wait(self, event: asyncio.Event, timeout_s: float) -> None:
        waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.stopping.wait())]
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()

    async def _take_round(self) -> int:
        """Fill free slots one item at a time, each from the job first in fair-share order; items
        reclaimed from dead workers go first (they have waited longest): a job with reclaimable items
        left takes no new one until they are all running."""
        took = await self._reclaim_due()
        exhausted: set[str] = set(self.reclaim_backlog)
        while self.free > 0 and not self.stopping.is_set():
            order = [job for job in self.fair.order() if job not in exhausted]
            if not order:
                break
            job = order[0]
            entry = await self._read_one(job)
            if entry is None:
                exhausted.add(job)
                self.fair.mark_idle(job)
                continue
            self.fair.charge(job)
            took += await self._start(job, entry, reclaimed=False)
        return took

    async def _read_one(self, job: str) -> Entry | None:
        limit = self.max_in_flight.get(job)
        if limit is not None:
            in_flight: Any = await self.redis.hget(keys.job_stats(job), "in_flight")
            if int(in_flight or 0) >= limit:
                return None
        reply: Any = await self.redis.xreadgroup(WORKERS_GROUP, self.name, {keys.work_stream(job): ">"}, count=1)
        if not reply or not reply[0][1]:
            return None
        entry: Entry = reply[0][1][0]
        return entry

    async def _start(self, job: str, entry: Entry, *, reclaimed: bool, deliveries: int = 1) -> int:
        """Run the entry's item (1), or move it to the dead letters (0): an entry that cannot be
        decoded, or one delivered more than ``max_deliveries`` times (its holders died with it)."""
        entry_id, fields = entry
        try:
            raw = WorkEntry.from_fields(fields).item
            item = WorkItem.decode(raw, await self._task(job, raw))
        except (KeyError, ValueError) as exc:  # no such task, pydantic's ValidationError, bytes that are no JSON
            await self.runner.dead.move(job, entry_id, fields, work.UNDECODABLE, first_line(exc))
            return 0
        if deliveries > self.settings.max_deliveries:
            error = f"delivered {deliveries} times (max_deliveries {self.settings.max_deliveries})"
            await self.runner.dead.move(job, entry_id, fields, work.REDELIVERED, error, item=item)
            return 0
        delivery = Delivery(job=job, entry_id=entry_id.decode(), item=item, fields=fields)
        task = asyncio.create_task(self.runner.run(delivery), name=item.trajectory_id)
        self.running[task] = delivery
        task.add_done_callback(self._done)
        (self.metrics.reclaimed if reclaimed else self.metrics.taken).labels(job).inc()
        self.metrics.running.set(len(self.running))
        return 1

    async def _task(self, job: str, raw: bytes) -> Task:
        """The item's task, stored once per rollout; the last few are kept parsed."""
        rollout_id, task_id = WorkItem.task_ref(raw)
        key = (job, rollout_id, task_id)
        task = self._tasks.get(key)
        if task is None:
            stored: Any = await self.redis.hget(keys.rollout_tasks(job, rollout_id), task_id)
            if stored is None:
                raise KeyError(f"rollout {rollout_id} has no task {task_id!r}")
            if len(self._tasks) >= TASK_CACHE:
                self._tasks.clear()
            task = self._tasks[key] = Task.model_validate_json(stored)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        self.metrics.running.set(len(self.running))
        self.slot_freed.set()
        error = None if task.cancelled() else task.exception()
        if isinstance(error, STORE_ERRORS):  # left pending, delivered again; logged once per outage
            self.outage.failed(error)
        elif error is not None:
            log.error("item %s failed outside its attempts", task.get_name(), exc_info=error)

    # -- liveness ----------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """Reset the idle time of the entries we hold (so they are not reclaimed) and renew leases."""
        by_job: dict[str, list[str]] = {}
        for delivery in list(self.running.values()):
            by_job.setdefault(delivery.job, []).append(delivery.entry_id)
        vanished = False
        for job, ids in by_job.items():
            claim: list[Any] = list(ids)
            try:
                await self.redis.xclaim(keys.work_stream(job), WORKERS_GROUP, self.name, 0, claim, justid=True)
            except ResponseError as exc:  # the job's stream is gone: the other jobs' entries are still claimed
                if "NOGROUP" not in str(exc):
                    raise
                vanished = True
        if vanished and await self.generation.observe_async(self.redis):
            self.drop_running(STOP_STORE_LOST)  # the store lost its state: what refresh_jobs would do next
        outages = self.deps.outages
        if outages is not None and not outages.breakers[BROKER].up.is_set():
            return  # renewals wait for the broker; the items' idle time above must not
        # every held lease not being renewed already, in one call to the broker; in the background:
        # a slow broker never holds the XCLAIM above
        due = [lease for lease in list(self.deps.leases) if lease not in self.renewing]
        if due:
            task = asyncio.create_task(self._renew(due), name=f"renew {len(due)} leases")
            self.renewing.update(dict.fromkeys(due, task))
            task.add_done_callback(functools.partial(self._renewed, due))

    def _renewed(self, leases: list[str], task: asyncio.Task[None]) -> None:
        for lease in leases:
            if self.renewing.get(lease) is task:
                del self.renewing[lease]

    async def _renew(self, leases: list[str]) -> None:
        try:
            ended = await self.deps.broker.renew_many(leases, self.settings.lease_ttl_s)
        except Exception as exc:
            log.warning("renewal of %d leases failed: %s", len(leases), exc)
            return
        for lease in ended:
            if lease in self.deps.leases:  # not one let go while the call was on its way
                log.warning("renewal of lease %s failed: the broker holds no live lease of that id", lease)

    async def _reclaim_due(self) -> int:
        """Reclaim every job's idle items at most every ``reclaim_interval_s``, and the jobs with a
        backlog of reclaimable items every round; how many items were taken over."""
        before = len(self.running)
        if time.monotonic() >= self._next_reclaim:
            self._next_reclaim = time.monotonic() + self.settings.reclaim_interval_s
            await self.reclaim()
        else:
            for job in self.fair.order(self.reclaim_backlog):
                await self._reclaim_job(job)
        return len(self.running) - before

    async def reclaim(self) -> None:
        """Take over items another worker has not heartbeated for ``reclaim_idle_s``; forget dead workers."""
        for job in self.fair.order():
            await self._reclaim_job(job)
            await remove_dead_consumers(self.redis, keys.work_stream(job), self.name, self.settings.reclaim_idle_s)

    async def _reclaim_job(self, job: str) -> None:
        idle_ms = int(self.settings.reclaim_idle_s * 1000)
        cursor = "0-0"
        if self.free <= 0:
            return  # nothing learnt: the job keeps its backlog mark, if any
        self.reclaim_backlog.add(job)  # until a scan reaches the end of the pending list
        while self.free > 0 and not self.stopping.is_set():
            reply: Any = await self.redis.xautoclaim(
                keys.work_stream(job), WORKERS_GROUP, self.name, idle_ms, start_id=cursor, count=self.free
            )
            mine = {d.entry_id for d in self.running.values() if d.job == job}
            for entry_id, fields in reply[1]:
                if entry_id.decode() in mine:  # running here: its heartbeat missed (Redis away); still ours
                    continue
                if fields:
                    deliveries = await self.runner.dead.deliveries(job, entry_id)
                    log.info("reclaimed %s from a dead worker (job %s, delivery %d)", entry_id.decode(), job,
                             deliveries)  # fmt: skip
                    await self._start(job, (entry_id, fields), reclaimed=True, deliveries=deliveries)
            cursor = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            if cursor == "0-0":  # the whole pending list was scanned
                self.reclaim_backlog.discard(job)
                return

    def drop_running(self, reason: str) -> None:
        """Stop every running episode for ``reason`` (Redis came back empty: their jobs are gone)."""
        if self.running:
            log.warning("stopping %d running episodes: %s", len(self.running), reason)
        for task, delivery in list(self.running.items()):
            delivery.stop_reason = reason
            task.cancel()
        self._tasks.clear()

    async def watch_cancellations(self) -> None:
        pairs = {(d.job, d.item.rollout_id) for d in self.running.values()}
        if not pairs:
            return
        ordered = sorted(pairs)
        async with self.redis.pipeline(transaction=False) as pipe:
            for job, rollout_id in ordered:
                pipe.hget(keys.rollout_record(job, rollout_id), "cancelled")
            flags = await pipe.execute()
        cancelled = {pair for pair, flag in zip(ordered, flags, strict=True) if flag == b"1"}
        for task, delivery in list(self.running.items()):
            if (delivery.job, delivery.item.rollout_id) in cancelled and delivery.stop_reason is None:
                delivery.stop_reason = STOP_CANCELLED
                task.cancel()

    # -- shutdown ----------------------------------------------------------------------------

    async def _drain(self) -> None:
        if not self.running:
            return
        log.info("stopping: %d episodes get %.0fs to finish", len(self.running), self.settings.shutdown_grace_s)
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.running and time.monotonic() < deadline:
            await asyncio.wait(list(self.running), timeout=max(0.0, deadline - time.monotonic()))
        for task, delivery in list(self.running.items()):
            delivery.stop_reason = delivery.stop_reason or STOP_SHUTDOWN
            task.cancel()
        await asyncio.gather(*list(self.running), return_exceptions=True)


async def remove_dead_consumers(redis: Redis, stream: str, keep: str, idle_s: float) -> list[str]:
    """Delete the consumers of the workers' group that hold nothing and were silent for ``idle_s``
    (workers that are gone; a live one that was merely idle is recreated by its next XREADGROUP)."""
    removed = []
    consumers: Any = await redis.xinfo_consumers(stream, WORKERS_GROUP)
    for consumer in consumers:
        name = _text(consumer["name"])
        if name != keep and int(consumer["pending"]) == 0 and int(consumer["idle"]) > idle_s * 1000:
            await redis.xgroup_delconsumer(stream, WORKERS_GROUP, name)
            removed.append(name)
    if removed:
        log.info("removed %d consumer(s) of %s with nothing pending, silent for %.0fs: %s", len(removed), stream,
                 idle_s, ", ".join(removed))  # fmt: skip
    return removed


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

"""One work item from take to ack: attempts with backoff, the single final record, the ack.

Every ending is published exactly once (the publish script refuses a second record for the same
trajectory): ``completed``/``truncated`` from the episode, ``infra_error`` when attempts run out,
``cancelled`` when the rollout was cancelled. A worker shutting down hands the item back instead
(no record, no ack) so another worker takes it. An item whose processing fails outside its
attempts (publishing or acknowledging it raised) goes to the dead letters (``dead_letters.py``);
a Redis outage spends no attempt: the item's own Redis calls are tried again until Redis answers
(within ``outage_budget_s``), logged once per outage, and an episode that met the outage is run
again as the same attempt.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from redis.asyncio import Redis

from services.protocol import ErrorCode, InfraFailure, InfraStage, Status, Trajectory, WorkItem, counters, keys, work
from services.protocol.keys import WORKERS_GROUP
from services.rollout_api.publishing import publish, trajectory_shell
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.worker.agent import AgentDeps, Episode
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.dead_letters import DeadLetters, first_line
from services.rollout_api.worker.metrics import WorkerMetrics
from services.runtime.outages import STORE_ERRORS, Outage

log = logging.getLogger(__name__)

STOP_CANCELLED = "cancelled"  # the rollout was cancelled: publish as cancelled
STOP_SHUTDOWN = "shutdown"  # this worker is stopping: hand the item back
STOP_STORE_LOST = "store_lost"  # Redis came back empty: the item's job is gone, record nothing
T = TypeVar("T")


STORE_AWAY_RETRY_S = 1.0  # before running again an attempt that a service failed with store_unavailable


class StoreAway(Exception):
    """The episode met Redis away: no fault of the attempt, which is given back and run again."""


@dataclass
class Delivery:
    """A work-stream entry this worker holds (in its pending list) until it acks it."""

    job: str
    entry_id: str
    item: WorkItem
    stop_reason: str | None = None  # set before the running task is cancelled
    fields: dict[bytes, bytes] = field(default_factory=dict)  # the entry as read (copied to a dead letter)


class ItemRunner:
    def __init__(self, redis: Redis, scripts: Scripts, deps: AgentDeps, metrics: WorkerMetrics) -> None:
        self.redis = redis
        self.scripts = scripts
        self.deps = deps
        self.metrics = metrics
        self.settings = deps.settings
        self.dead = DeadLetters(redis, scripts, metrics, worker_id=deps.worker_id,
                                maxlen=deps.settings.trajectory_stream_maxlen)  # fmt: skip
        self.store = Outage("Redis (items' records)", log)  # shared by every item: one line per outage

    async def _stored(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call``, a Redis call safe to repeat, tried again while Redis is away (up to the outage budget)."""
        give_up = time.monotonic() + self.settings.outage_budget_s
        delay = 0.1
        while True:
            try:
                result = await call()
            except STORE_ERRORS as exc:
                self.store.failed(exc)
                if time.monotonic() + delay > give_up:
                    raise
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            self.store.ok()
            return result

    async def run(self, delivery: Delivery) -> None:
        try:
            try:
                await self._attempts(delivery)
            except asyncio.CancelledError:
                await asyncio.shield(self._stopped(delivery))
                raise
        except STORE_ERRORS:
            raise  # Redis is away: the entry stays pending and is delivered again
        except Exception as exc:  # never again: it would fail the same way on every delivery
            log.exception("%s failed outside its attempts", delivery.item.trajectory_id)
            await asyncio.shield(self.dead.move(delivery.job, delivery.entry_id, delivery.fields, work.FAILED,
                                                first_line(exc), item=delivery.item))  # fmt: skip

    async def _attempts(self, delivery: Delivery) -> None:
        item = delivery.item
        store_away_at: float | None = None  # when a service first answered that the store was away
        while True:
            taken = await self._stored(lambda: self.scripts.take(item.job, item.rollout_id, item.trajectory_id))
            if taken.attempt < 0:  # already has its record (a duplicate delivery)
                await self._ack(delivery)
                return
            if taken.cancelled:
                await self._finish(delivery, trajectory_shell(item, taken.attempt, Status.CANCELLED), ran=False)
                return
            if taken.attempt > item.max_attempts:  # earlier holders died on every attempt
                error = InfraError(InfraStage.WORKER, ErrorCode.INTERNAL_ERROR, "workers were lost on every attempt")
                await self._finish(delivery, self._infra(item, taken.attempt - 1, error), ran=False)
                return
            trips = self._trips()
            try:
                failure = await self._attempt(delivery, taken.attempt)
            except StoreAway:  # wait for Redis, then run the same attempt again
                await self._stored(self.redis.ping)
                await self._stored(lambda: self.scripts.give_back(item.job, item.rollout_id, item.trajectory_id))
                self.metrics.attempts_kept.inc()
                continue
            if failure is None:
                return
            if failure.code == ErrorCode.STORE_UNAVAILABLE:  # the broker or proxy found the shared Redis away
                store_away_at = store_away_at or time.monotonic()
                if time.monotonic() - store_away_at < self.settings.outage_budget_s:
                    log.info("%s: a service's store was away; running the attempt again without spending it",
                             item.trajectory_id)  # fmt: skip
                    await asyncio.sleep(STORE_AWAY_RETRY_S)
                    await self._stored(self.redis.ping)
                    await self._stored(lambda: self.scripts.give_back(item.job, item.rollout_id, item.trajectory_id))
                    self.metrics.attempts_kept.inc()
                    continue
            if await self._outage_kept(delivery, trips):
                continue  # the attempt was given back: the same attempt number runs again
            error = failure
            count = functools.partial(self.scripts.count, item.job, item.rollout_id,
                                      counters.failed_attempts(error.stage.value))  # fmt: skip
            await self._stored(count)
            self.metrics.infra.labels(error.stage.value).inc()
            if not error.retryable or taken.attempt >= item.max_attempts:
                await self._finish(delivery, self._infra(item, taken.attempt, error), ran=True)
                return
            await asyncio.sleep(self._backoff(taken.attempt))

    async def _attempt(self, delivery: Delivery, attempt: int) -> InfraError | None:
        """Run one attempt; None when it was published, else the infrastructure failure."""
        item = delivery.item
        try:
            traj = await Episode(self.deps, item, attempt).run()
        except InfraError as exc:
            log.info("%s attempt %d failed: %s", item.trajectory_id, attempt, exc)  # the give-up is the WARNING
            return exc
        except STORE_ERRORS as exc:
            self.store.failed(exc)
            raise StoreAway from exc
        except Exception as exc:  # a bug in this worker: record it as the worker's failure, never as reward 0
            log.exception("%s attempt %d crashed", item.trajectory_id, attempt)
            return InfraError(InfraStage.WORKER, ErrorCode.INTERNAL_ERROR, f"worker error: {exc!r}")
        self.metrics.turns.inc(len(traj.turns))
        self.metrics.episode_seconds.observe(traj.timings.total_s)
        await self._finish(delivery, traj, ran=True)
        return None

    def _trips(self) -> int:
        outages = self.deps.outages
        return outages.trips() if outages is not None else 0

    async def _outage_kept(self, delivery: Delivery, trips_before: int) -> bool:
        """An attempt that failed while a dependency had an outage is not spent: wait until every
        dependency answers (within the outage budget), give the attempt back, and run it again."""
        outages = self.deps.outages
        if outages is None or outages.trips() == trips_before:
            return False
        if not await outages.wait_all_up():
            return False  # past the outage budget: the ordinary infra path
        item = delivery.item
        log.info("%s: attempt failed during an outage; running it again without spending it", item.trajectory_id)
        await self.scripts.give_back(item.job, item.rollout_id, item.trajectory_id)
        self.metrics.attempts_kept.inc()
        return True

    def _backoff(self, attempt: int) -> float:
        return float(min(self.settings.retry_backoff_max_s, self.settings.retry_backoff_s * 2 ** (attempt - 1)))

    def _infra(self, item: WorkItem, attempt: int, error: InfraError) -> Trajectory:
        traj = trajectory_shell(item, max(1, attempt), Status.INFRA_ERROR, worker=self.deps.worker_id)
        traj.infra = InfraFailure(stage=error.stage, code=error.code, message=error.message, attempts=attempt)
        return traj

    async def _stopped(self, delivery: Delivery) -> None:
        item = delivery.item
        if delivery.stop_reason == STOP_STORE_LOST:
            return  # a record or a give-back would recreate keys of a job that no longer exists
        if delivery.stop_reason == STOP_CANCELLED:
            attempt = int(await self.redis.hget(keys.attempts(item.job), item.trajectory_id) or 1)
            await self._finish(delivery, trajectory_shell(item, attempt, Status.CANCELLED), ran=False)
        else:  # shutdown: give the attempt back; the entry stays pending and is reclaimed elsewhere
            await self.scripts.give_back(item.job, item.rollout_id, item.trajectory_id)

    async def _finish(self, delivery: Delivery, traj: Trajectory, *, ran: bool) -> None:
        traj.worker = self.deps.worker_id
        if not ran:
            traj.finished_at = time.time()
        maxlen = self.settings.trajectory_stream_maxlen
        entry = await self._stored(lambda: publish(self.scripts, traj, maxlen=maxlen, ran=ran))
        if entry is not None:
            self.metrics.published.labels(traj.job, traj.status.value).inc()
            if (infra := traj.infra) is not None:  # once per trajectory: only its first record is published
                log.warning("%s given up as infra_error after %d attempt(s) at %s (%s): %s", traj.trajectory_id,
                            infra.attempts, infra.stage.value, infra.code, infra.message)  # fmt: skip
        await self._ack(delivery)

    async def _ack(self, delivery: Delivery) -> None:
        await self._stored(lambda: self._ack_once(delivery))

    async def _ack_once(self, delivery: Delivery) -> None:
        stream = keys.work_stream(delivery.job)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, WORKERS_GROUP, delivery.entry_id)
            pipe.xdel(stream, delivery.entry_id)
            await pipe.execute()

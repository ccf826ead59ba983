"""Admission control: global, per-backend and per-job lease limits (counted in Redis, so they hold
across replicas), a fair wait queue (jobs take turns), deadlines that end in 429/503 with
Retry-After, and a token bucket on sandbox creates."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.runtime.tasks import cancel_and_wait

ADMITTED, GLOBAL_FULL, BACKEND_FULL, JOB_FULL = 0, 1, 2, 3
POLL_S = 0.05  # how often waiters re-check (releases on other replicas are not announced)

# tries to reserve one lease; returns ADMITTED or why not
Reserve = Callable[[], Awaitable[int]]


@dataclass(eq=False)
class _Waiter:
    job: str
    reserve: Reserve
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    reason: int = GLOBAL_FULL


class Admission:
    """Serves waiting lease requests in turn by job (round-robin), each job's own in arrival order."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[_Waiter]] = {}
        self._rotation: deque[str] = deque()
        self._lock = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def admit(self, job: str, reserve: Reserve, wait_s: float) -> None:
        """Return once ``reserve`` succeeded; raise 429 (job quota) or 503 (capacity) after ``wait_s``."""
        queued = bool(self._queues)
        reason = GLOBAL_FULL if queued else await reserve()
        if reason == ADMITTED:
            return
        waiter = _Waiter(job, reserve, reason=reason)  # a refusal names the reason of its last round
        self._enqueue(waiter)
        if queued:  # others wait: a round now, in the queue's order, so that a request with little or no
            # wait is served where capacity is free (a job at its quota holds up no other job) and is
            # refused for what is full: its own job's quota (429) or the capacity (503)
            try:
                async with self._lock:
                    await self._round()
            except BaseException as exc:  # a reservation failed (Redis) or the caller went away
                if not waiter.done.done() or not isinstance(exc, Exception):  # nobody is left to take its turn
                    self._remove(waiter)  # (admitted, then cancelled: as a cancelled wait below)
                    raise
            if waiter.done.done():
                return
        self.poke()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.done), wait_s)
        except TimeoutError:
            if waiter.done.done() and waiter.done.exception() is None:
                return  # admitted at the last moment
            self._remove(waiter)
            raise _refusal(waiter.reason, wait_s) from None
        except asyncio.CancelledError:
            self._remove(waiter)
            raise

    def poke(self) -> None:
        """Something was released: let the queue try again."""
        if self._queues and (self._poller is None or self._poller.done()):
            self._poller = asyncio.get_running_loop().create_task(self._serve())

    async def close(self) -> None:
        await cancel_and_wait(self._poller)

    async def _serve(self) -> None:
        while self._queues:
            async with self._lock:
                await self._round()
            if self._queues:
                await asyncio.sleep(POLL_S)

    async def _round(self) -> None:
        """Offer capacity to each job in turn until one is refused for global or backend capacity. Every
        waiter is left with the reason it would be refused for now: its job's quota where its job's first
        waiter was refused for that, else the capacity that was full."""
        quota_full: set[str] = set()
        for job in list(self._rotation):
            queue = self._queues.get(job)
            while queue:
                waiter = queue[0]
                if waiter.done.done():
                    queue.popleft()
                    continue
                waiter.reason = await waiter.reserve()
                if waiter.reason == JOB_FULL:
                    quota_full.add(job)
                    self._tell(job, JOB_FULL)
                    break
                if waiter.reason != ADMITTED:
                    for other in self._queues:
                        if other not in quota_full:
                            self._tell(other, waiter.reason)
                    return
                queue.popleft()
                waiter.done.set_result(None)
                self._rotation.remove(job)
                self._rotation.append(job)
                break
            if not queue:
                self._drop(job)

    def _tell(self, job: str, reason: int) -> None:
        for waiter in self._queues.get(job, ()):
            waiter.reason = reason

    def _enqueue(self, waiter: _Waiter) -> None:
        if waiter.job not in self._queues:
            self._queues[waiter.job] = deque()
            self._rotation.append(waiter.job)
        self._queues[waiter.job].append(waiter)

    def _remove(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.job)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                self._drop(waiter.job)

    def _drop(self, job: str) -> None:
        self._queues.pop(job, None)
        if job in self._rotation:
            self._rotation.remove(job)


def _refusal(reason: int, waited_s: float) -> PlatformError:
    retry = max(1.0, min(30.0, waited_s or 1.0))
    if reason == JOB_FULL:
        return PlatformError(ErrorCode.QUOTA_EXCEEDED, f"the job's lease quota stayed full for {waited_s:.1f}s",
                             retry_after_s=retry)  # fmt: skip
    where = "backend" if reason == BACKEND_FULL else "broker"
    return PlatformError(ErrorCode.CAPACITY_EXHAUSTED, f"{where} lease capacity stayed full for {waited_s:.1f}s",
                         retry_after_s=retry)  # fmt: skip


class TokenBucket:
    """``rate`` sandbox creates per second with bursts of ``burst``; rate 0 means unlimited."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, deadline: float | None = None) -> None:
        """Wait for a token; raise 429 ``rate_limited`` if it would come after ``deadline`` (monotonic)."""
        if self.rate <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            wait = (1.0 - self.tokens) / self.rate if self.tokens < 1.0 else 0.0
            if deadline is not None and now + wait > deadline:
                raise PlatformError(ErrorCode.RATE_LIMITED, "sandbox create rate limit",
                                    retry_after_s=max(wait, 0.1))  # fmt: skip
            self.tokens -= 1.0
        if wait > 0:
            await asyncio.sleep(wait)

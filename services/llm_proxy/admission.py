"""The overload queue: where a call waits when every routable engine of its pool is saturated.

An engine is saturated for this process when it holds ``slots`` calls from it (the setting
``engine_max_in_flight`` split evenly over the worker processes). A call that finds no free
engine, or finds earlier calls already waiting, joins its pool's queue and is served first come,
first served as slots free up. The queue is bounded (calls and request bytes per process); a
call past either bound, or one that waited ``wait_s``, is answered 503 ``capacity_exhausted``
with ``Retry-After``; a call whose own deadline passes while queued gets 504
``upstream_timeout``. Depth, bytes, limits, waits and refusals are in ``/metrics``.

Only the head of a queue looks for a slot: it is woken when a call of its pool leaves an engine,
and re-checks on its own every ``recheck_s`` (an engine joined or rejoined), so membership changes
cannot strand it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.llm_proxy.fleet import EngineRuntime
from services.llm_proxy.metrics import ProxyMetrics
from services.protocol import ErrorCode, PlatformError

Engines = Callable[[], list[EngineRuntime]]


@dataclass(frozen=True, slots=True)
class QueueLimits:
    slots: int  # calls one engine takes from this process at once; 0: no limit (never queues)
    max_calls: int  # calls waiting at once in this process (all pools)
    max_bytes: int  # request bytes waiting at once in this process
    wait_s: float  # longest wait before 503
    retry_after_s: float = 2.0
    recheck_s: float = 0.5


@dataclass(eq=False, slots=True)
class _Waiter:
    size: int
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class Admission:
    def __init__(self, limits: QueueLimits, metrics: ProxyMetrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.waiting = 0
        self.waiting_bytes = 0
        self._queues: dict[str, deque[_Waiter]] = {}

    def free(self, engines: list[EngineRuntime]) -> list[EngineRuntime]:
        """The engines with a slot left for this process."""
        slots = self.limits.slots
        return engines if slots == 0 else [e for e in engines if e.in_flight < slots]

    async def engines(self, pool: str, routable: Engines, size: int, deadline_at: float | None) -> list[EngineRuntime]:
        """Routable engines with a free slot, waiting in the pool's queue while there are none.
        Empty only when the pool has no routable engine at all."""
        queue = self._queues.get(pool)
        if not queue:
            engines = routable()
            free = self.free(engines)
            if free or not engines:
                return free
        return await self._wait(pool, routable, size, deadline_at)

    def released(self, pool: str) -> None:
        """A call of ``pool`` left an engine: the head of the pool's queue may take its slot."""
        queue = self._queues.get(pool)
        if queue:
            queue[0].woken.set()

    async def _wait(self, pool: str, routable: Engines, size: int, deadline_at: float | None) -> list[EngineRuntime]:
        self._admit(size)
        queue = self._queues.setdefault(pool, deque())
        waiter = _Waiter(size)
        queue.append(waiter)
        started = time.perf_counter()
        outcome = "cancelled"
        try:
            found = await self._until_free(queue, waiter, routable, deadline_at, started)
            outcome = "admitted" if found else "no_engine"
            return found
        except PlatformError as exc:
            outcome = "deadline" if exc.code is ErrorCode.UPSTREAM_TIMEOUT else "timeout"
            raise
        finally:
            self._leave(queue, waiter)
            self.metrics.queue_waits.labels(outcome).inc()
            self.metrics.queue_wait_seconds.observe(time.perf_counter() - started)

    async def _until_free(
        self, queue: deque[_Waiter], waiter: _Waiter, routable: Engines, deadline_at: float | None, started: float
    ) -> list[EngineRuntime]:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.limits.wait_s
        while True:
            if queue[0] is waiter:
                engines = routable()
                free = self.free(engines)
                if free or not engines:
                    return free
            now = loop.time()
            if deadline_at is not None and now >= deadline_at:
                waited = time.perf_counter() - started
                raise PlatformError(
                    ErrorCode.UPSTREAM_TIMEOUT, f"the call's deadline passed after {waited:.1f} s in the overload queue"
                )
            if now >= give_up:
                raise self._refusal(f"no engine slot freed within {self.limits.wait_s:g} s (overload queue)")
            waiter.woken.clear()
            until = min(give_up, deadline_at if deadline_at is not None else give_up, now + self.limits.recheck_s)
            try:
                async with asyncio.timeout_at(until):
                    await waiter.woken.wait()
            except TimeoutError:
                pass

    def _admit(self, size: int) -> None:
        lim = self.limits
        if self.waiting >= lim.max_calls:
            self.metrics.queue_waits.labels("full").inc()
            raise self._refusal(f"every engine is saturated and the overload queue is full ({lim.max_calls} calls)")
        if self.waiting and self.waiting_bytes + size > lim.max_bytes:
            self.metrics.queue_waits.labels("full").inc()
            raise self._refusal(f"every engine is saturated and the overload queue is full ({lim.max_bytes} bytes)")
        self.waiting += 1
        self.waiting_bytes += size
        self.metrics.queue_depth.inc()
        self.metrics.queue_bytes.inc(size)

    def _leave(self, queue: deque[_Waiter], waiter: _Waiter) -> None:
        was_head = queue[0] is waiter
        queue.remove(waiter)
        self.waiting -= 1
        self.waiting_bytes -= waiter.size
        self.metrics.queue_depth.dec()
        self.metrics.queue_bytes.dec(waiter.size)
        if was_head and queue:
            queue[0].woken.set()  # the next call looks for a slot at once

    def _refusal(self, message: str) -> PlatformError:
        return PlatformError(ErrorCode.CAPACITY_EXHAUSTED, message, retry_after_s=self.limits.retry_after_s)

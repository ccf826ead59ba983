"""Outages of the services a worker depends on (the LLM proxy, the sandbox broker) are waited out.

Each dependency has a circuit breaker. A call that finds the service unreachable trips it; from
then on a probe polls the service's ``/healthz`` until it answers, and the breaker closes again.
While any breaker is open the worker takes no new work, and running episodes hold: a call that
never reached the service is sent again once it is back, and an attempt that failed because of
the outage is run again without spending one of the item's attempts. Only an outage longer than
the outage budget (``outage_budget_s``, default 10 minutes) lets failures take the ordinary infra
path (retries, then ``infra_error``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from services.rollout_api.worker.metrics import WorkerMetrics
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)
T = TypeVar("T")

PROXY = "proxy"
BROKER = "broker"


class Unreachable(Exception):
    """A call did not reach its service (refused, reset, no answer): safe to send again."""


class Breaker:
    """One dependency: closed (up) or open (down since ``down_since``, probed until it answers)."""

    def __init__(
        self, name: str, health_url: str, session: aiohttp.ClientSession, probe_s: float, metrics: WorkerMetrics
    ) -> None:
        self.name = name
        self.health_url = health_url
        self.session = session
        self.probe_s = probe_s
        self.metrics = metrics
        self.up = asyncio.Event()
        self.up.set()
        self.down_since: float | None = None
        self.trips = 0  # outages seen so far (an attempt compares this before and after)
        self._probe: asyncio.Task[None] | None = None

    def trip(self, reason: str) -> None:
        """The service did not answer a call: open the breaker (once per outage) and start probing."""
        if not self.up.is_set():
            return
        log.warning("%s unreachable (%s): holding episodes, taking no new work until it answers", self.name, reason)
        self.up.clear()
        self.down_since = time.monotonic()
        self.trips += 1
        self.metrics.outages.labels(self.name).inc()
        self.metrics.dependency_up.labels(self.name).set(0)
        self._probe = asyncio.get_running_loop().create_task(self._poll(), name=f"probe {self.name}")

    async def _poll(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.probe_s))
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                async with self.session.get(self.health_url, timeout=timeout) as response:
                    if response.status == 200:
                        break
            except (aiohttp.ClientError, TimeoutError):
                continue
        held = time.monotonic() - (self.down_since or time.monotonic())
        log.warning("%s is back after %.1fs", self.name, held)
        self.down_since = None
        self.up.set()
        self.metrics.dependency_up.labels(self.name).set(1)

    async def close(self) -> None:
        await cancel_and_wait(self._probe)


class Outages:
    """The breakers of one worker and its outage budget."""

    def __init__(self, breakers: dict[str, Breaker], budget_s: float) -> None:
        self.breakers = breakers
        self.budget_s = budget_s

    @property
    def all_up(self) -> bool:
        return all(b.up.is_set() for b in self.breakers.values())

    def trips(self) -> int:
        """Outages seen so far, over every dependency."""
        return sum(b.trips for b in self.breakers.values())

    async def wait_all_up(self, stopping: asyncio.Event | None = None) -> bool:
        """Wait until every breaker is closed; False when an outage outlasted the budget (or stopping)."""
        for breaker in self.breakers.values():
            if not await self._wait(breaker, stopping):
                return False
        return True

    async def _wait(self, breaker: Breaker, stopping: asyncio.Event | None) -> bool:
        if breaker.up.is_set():
            return True
        left = self.budget_s - (time.monotonic() - (breaker.down_since or time.monotonic()))
        waiters = [asyncio.ensure_future(breaker.up.wait())]
        if stopping is not None:
            waiters.append(asyncio.ensure_future(stopping.wait()))
        await asyncio.wait(waiters, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        return breaker.up.is_set()

    async def call(self, name: str, send: Callable[[], Awaitable[T]]) -> T:
        """``send()``, sent again after each outage of ``name`` while within the budget."""
        breaker = self.breakers[name]
        while True:
            try:
                return await send()
            except Unreachable as exc:
                breaker.trip(str(exc.__cause__ or exc))
                if not await self._wait(breaker, None):
                    raise
                breaker.metrics.resent.labels(name).inc()

    async def close(self) -> None:
        for breaker in self.breakers.values():
            await breaker.close()

"""One proxy process's view of the fleet: the shared membership (followed from Redis within a
second, at once on a change notice) plus what only this process knows: calls in flight, the
engines' reported load, health and ejection."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError
from yarl import URL

from services.llm_proxy.membership import EngineRecord, Fleet, MembershipStore, PoolRecord
from services.runtime.outages import Outage

log = logging.getLogger(__name__)


@dataclass(eq=False)
class EngineRuntime:
    """Per-process facts about one engine."""

    url: str
    engine_id: str
    in_flight: int = 0  # calls this process has on the engine now
    reported_load: int = 0  # requests the engine reported at the last poll (all proxies' calls)
    in_flight_at_report: int = 0
    failures: int = 0  # consecutive failed health checks or calls
    ejected: bool = False
    weight_version: str | None = None  # what the engine reported last (/get_model_info)
    answered_at: float = 0.0  # monotonic time of the last good answer (a call or a probe)
    probed_at: float = 0.0  # monotonic time of the last probe
    _urls: dict[str, URL] = field(default_factory=dict)

    def endpoint(self, route: str) -> URL:
        """``url + route`` as a parsed URL, built once (parsing costs more than the rest of a send)."""
        found = self._urls.get(route)
        if found is None:
            found = self._urls[route] = URL(self.url + route)
        return found

    @property
    def load(self) -> int:
        """Engine-reported load, corrected by what this process sent or finished since the report."""
        return max(self.in_flight, self.reported_load + self.in_flight - self.in_flight_at_report)

    def report(self, num_reqs: int) -> None:
        self.reported_load = num_reqs
        self.in_flight_at_report = self.in_flight


class FleetView:
    """The local mirror of the shared :class:`Fleet`, refreshed by :meth:`follow`."""

    def __init__(self, store: MembershipStore, sync_interval_s: float, eject_after: int) -> None:
        self.store = store
        self.sync_interval_s = sync_interval_s
        self.eject_after = eject_after
        self.fleet = Fleet()
        self.runtime: dict[str, EngineRuntime] = {}
        self._pool_ready: dict[str, asyncio.Event] = {}
        self._routable: dict[str, list[EngineRuntime]] = {}  # per pool; cleared on every change

    # -- following Redis ----------------------------------------------------------------

    async def refresh(self) -> None:
        self.fleet = await self.store.read()
        self._routable.clear()
        for url, rec in self.fleet.engines.items():
            if url not in self.runtime:
                self.runtime[url] = EngineRuntime(url=url, engine_id=rec.engine_id)
        for url in list(self.runtime):
            if url not in self.fleet.engines and self.runtime[url].in_flight == 0:
                del self.runtime[url]
        for name, pool in self.fleet.pools.items():
            event = self.ready_event(name)
            if pool.updating:
                event.clear()
            else:
                event.set()

    async def follow(self, redis: Redis) -> None:
        """Refresh on every change notice and at least every ``sync_interval_s``."""
        outage = Outage("Redis (membership refresh)", log)
        pubsub = redis.pubsub()
        await pubsub.subscribe(self.store.channel)
        try:
            while True:
                try:
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.sync_interval_s)
                    while await pubsub.get_message(ignore_subscribe_messages=True, timeout=0):
                        pass  # coalesce a burst of notices into one refresh
                    await self.refresh()
                    outage.ok()
                except (RedisError, OSError, TimeoutError) as exc:  # Redis blip: keep the last view
                    outage.failed(exc)
                    await asyncio.sleep(self.sync_interval_s)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed in redis-py 8

    # -- queries ------------------------------------------------------------------------

    def ready_event(self, pool: str) -> asyncio.Event:
        event = self._pool_ready.get(pool)
        if event is None:
            event = self._pool_ready[pool] = asyncio.Event()
            event.set()
        return event

    def pool(self, name: str) -> PoolRecord | None:
        return self.fleet.pools.get(name)

    def routable(self, pool: str) -> list[EngineRuntime]:
        """Engines of ``pool`` that may take new calls: active and not ejected by this process."""
        cached = self._routable.get(pool)
        if cached is not None:
            return cached
        found = []
        for rec in self.fleet.engines.values():
            rt = self.runtime.get(rec.url)
            if rec.pool == pool and rec.state == "active" and rt is not None and not rt.ejected:
                found.append(rt)
        self._routable[pool] = found
        return found

    def record(self, url: str) -> EngineRecord | None:
        return self.fleet.engines.get(url)

    # -- health -------------------------------------------------------------------------

    def mark_ok(self, rt: EngineRuntime) -> None:
        if rt.ejected:
            log.info("engine %s is healthy again: rejoins", rt.engine_id)
            self._routable.clear()
        rt.failures = 0
        rt.ejected = False
        rt.answered_at = time.monotonic()

    def mark_failed(self, rt: EngineRuntime, why: str) -> None:
        rt.failures += 1
        if not rt.ejected and rt.failures >= self.eject_after:
            rt.ejected = True
            self._routable.clear()
            log.warning("engine %s ejected after %d failures (%s)", rt.engine_id, rt.failures, why)

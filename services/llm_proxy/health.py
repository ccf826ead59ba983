"""Health checks and load polling: every engine, every ``health_interval_s``, from every process.

``/get_load`` is the probe: it answers while the engine serves and reports its queue, which
refreshes the routing load. An engine failing ``eject_after_failures`` probes (or calls) in a
row is ejected; it rejoins by itself when probes pass again, unless it reports weights other
than its pool's current version (a restarted engine with stale weights stays out). An engine
that answered a call within the last interval is not probed (that answer was its health check),
except every ``LOAD_REFRESH_INTERVALS`` intervals, to refresh its load. A probe that times out on
an engine busy with this process's calls, one of which it answered within ``BUSY_GRACE_S``, is
not a failure (counted in ``rollout_proxy_busy_probes_total``): under load ``/get_load`` answers
late while generations still complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from services.llm_proxy.fleet import EngineRuntime, FleetView
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.upstream import EngineClient, open_connections
from services.runtime.redis_pool import Observed

log = logging.getLogger(__name__)

LOAD_REFRESH_INTERVALS = 5
# an engine with calls in flight that answered one this recently is busy, not dead, when its probe
# times out (a loaded engine answers /get_load late); a hung one stops answering calls and is
# ejected once this has passed
BUSY_GRACE_S = 60.0


class HealthChecker:
    def __init__(
        self,
        view: FleetView,
        client: EngineClient,
        session: aiohttp.ClientSession,
        metrics: ProxyMetrics,
        redis_pool: Observed | None = None,
        lean_connections: Callable[[], int] = lambda: 0,
    ) -> None:
        self.view = view
        self.lean_connections = lean_connections  # the forwarder's own clients (upstream.EngineLinks)
        self.client = client
        self.session = session
        self.metrics = metrics
        self.redis_pool = redis_pool

    async def run(self, interval_s: float) -> None:
        while True:
            await self.check_all(interval_s)
            await asyncio.sleep(interval_s)

    async def check_all(self, interval_s: float = 0.0) -> None:
        now = time.monotonic()
        due = [
            rt
            for rt in list(self.view.runtime.values())
            if now - rt.answered_at >= interval_s or now - rt.probed_at >= LOAD_REFRESH_INTERVALS * interval_s
        ]
        await asyncio.gather(*(self.check(rt) for rt in due))
        self.metrics.upstream_connections.set(open_connections(self.session) + self.lean_connections())
        self.metrics.saturation(self.redis_pool)

    async def check(self, rt: EngineRuntime) -> None:
        rt.probed_at = time.monotonic()
        status, doc = await self.client.call("GET", rt.url + "/get_load")
        if status == 0 and _busy(rt, doc):
            self.metrics.busy_probes.labels(rt.engine_id).inc()
        elif status != 200:
            self.view.mark_failed(rt, f"health check: {status} {doc}")
        elif rt.ejected and not await self._weights_current(rt):
            pass  # stays out until an admin re-adds it with the pool's weights
        else:
            rt.report(_num_reqs(doc))
            self.view.mark_ok(rt)
            if rt.weight_version is None:
                await self._learn_version(rt)
        self.metrics.engine_up.labels(rt.engine_id).set(0 if rt.ejected else 1)

    async def _learn_version(self, rt: EngineRuntime) -> None:
        """The version a new engine serves, for provenance before its pool's first update."""
        status, info = await self.client.call("GET", rt.url + "/get_model_info")
        if status == 200 and isinstance(info, dict) and info.get("weight_version") is not None:
            rt.weight_version = str(info["weight_version"])

    async def _weights_current(self, rt: EngineRuntime) -> bool:
        record = self.view.record(rt.url)
        pool = self.view.pool(record.pool) if record else None
        if pool is None or pool.version is None:
            return True
        status, info = await self.client.call("GET", rt.url + "/get_model_info")
        version = info.get("weight_version") if isinstance(info, dict) else None
        if status == 200 and version == pool.version:
            rt.weight_version = pool.version
            return True
        log.warning("engine %s is up but serves weights %r, pool %s is at %r", rt.engine_id, version, pool.name,
                    pool.version)  # fmt: skip
        return False


def _busy(rt: EngineRuntime, error: Any) -> bool:
    """The probe timed out on an engine that is serving this process's calls and answered one lately."""
    timed_out = "Timeout" in str(error).split(":", 1)[0]
    return timed_out and rt.in_flight > 0 and time.monotonic() - rt.answered_at < BUSY_GRACE_S


def _num_reqs(doc: Any) -> int:
    """SGLang's ``/get_load``: a list of per-DP-rank dicts (older versions: one dict)."""
    entries = doc if isinstance(doc, list) else [doc]
    return sum(int(e.get("num_reqs", 0)) for e in entries if isinstance(e, dict))

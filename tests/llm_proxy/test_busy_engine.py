"""A loaded engine answers ``/get_load`` late while its generations still complete: a probe that
times out on an engine busy with this process's calls is not a failure, so the engine is not
ejected; the same timeouts on an engine that has answered nothing for ``BUSY_GRACE_S`` eject it."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from services.llm_proxy.fleet import EngineRuntime, FleetView
from services.llm_proxy.health import BUSY_GRACE_S, HealthChecker
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.upstream import EngineClient
from tests.support.http import serving


async def test_a_busy_engine_whose_probe_times_out_is_not_ejected_a_silent_one_is() -> None:
    async def slow_load(_: web.Request) -> web.Response:
        await asyncio.sleep(0.5)  # longer than the probe's timeout
        return web.json_response([{"num_reqs": 3}])

    view = FleetView(store=None, sync_interval_s=1.0, eject_after=2)  # type: ignore[arg-type]
    metrics = ProxyMetrics()
    async with serving(web.get("/get_load", slow_load)) as url, aiohttp.ClientSession() as session:
        checker = HealthChecker(view, EngineClient(session, 0.1), session, metrics)
        busy = EngineRuntime(url, "busy", in_flight=4, answered_at=time.monotonic())
        for _ in range(4):
            await checker.check(busy)
        assert not busy.ejected and busy.failures == 0
        assert metrics.busy_probes.labels("busy")._value.get() == 4

        silent = EngineRuntime(url, "silent", in_flight=4, answered_at=time.monotonic() - BUSY_GRACE_S - 1)
        idle = EngineRuntime(url, "idle", in_flight=0, answered_at=time.monotonic())
        for _ in range(2):
            await checker.check(silent)
            await checker.check(idle)
        assert silent.ejected and idle.ejected

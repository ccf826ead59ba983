"""The worker's circuit breakers against a real HTTP service that goes away and comes back."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.outages import Breaker, Outages, Unreachable
from services.runtime.net import free_port


async def serve(port: int) -> web.AppRunner:
    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", ok)
    app.router.add_get("/work", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def outages_for(url: str, session: aiohttp.ClientSession, budget_s: float) -> Outages:
    return Outages({"svc": Breaker("svc", url + "/healthz", session, 0.05, WorkerMetrics(1))}, budget_s)


async def get(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url) as response:
            return response.status
    except aiohttp.ClientConnectorError as exc:
        raise Unreachable(str(exc)) from exc


async def test_a_call_is_sent_again_once_the_service_is_back() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        outages = outages_for(url, session, budget_s=30)
        call = asyncio.create_task(outages.call("svc", lambda: get(session, url + "/work")))
        await asyncio.sleep(0.3)
        assert not call.done() and not outages.all_up  # held, the breaker open
        runner = await serve(port)
        try:
            assert await call == 200
            assert outages.all_up and outages.trips() == 1
            assert await outages.wait_all_up()
        finally:
            await outages.close()
            await runner.cleanup()


async def test_an_outage_past_the_budget_fails_the_call() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with aiohttp.ClientSession() as session:
        outages = outages_for(url, session, budget_s=0.2)
        try:
            with pytest.raises(Unreachable):
                await outages.call("svc", lambda: get(session, url + "/work"))
            assert not await outages.wait_all_up()
        finally:
            await outages.close()

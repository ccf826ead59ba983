"""The API's Redis pools: many SSE subscribers on a bounded pool wait instead of failing, a
submission meanwhile is never starved, an idle stream stays open with keep-alives, and a Redis
outage is a 503 with Retry-After (not a 500)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import httpx
import pytest

from services.runtime.redis_server import EmbeddedRedis
from tests.rollout_api.test_api import ADMIN, auth, create_job, task
from tests.support.processes import ServiceProcess, start_service

pytestmark = pytest.mark.e2e


def start_api(redis_url: str, logs: Path, **env: str) -> ServiceProcess:
    return start_service(
        ["-m", "services.cli", "api", "--port", "{port}", "--redis-url", redis_url], log_dir=logs, name="api",
        env={"ROLLOUT_API_ADMIN_TOKEN": ADMIN, **env},
    )  # fmt: skip


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (labels matched as a subset)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


async def subscribe(session: aiohttp.ClientSession, url: str, token: str, keepalives: int) -> int:
    """Open the job's SSE stream and read until ``keepalives`` keep-alive comments arrived; the status."""
    async with session.get(url, headers=auth(token)) as response:
        if response.status != 200:
            return response.status
        seen = 0
        async for line in response.content:
            seen += line.startswith(b": keep-alive")
            if seen >= keepalives:
                return 200
    return 599  # the stream ended early


async def crowd_and_submit(api: str, token: str, subscribers: int) -> tuple[list[int], int]:
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = api + "/jobs/crowd/trajectories"
        readers = [asyncio.create_task(subscribe(session, url, token, 1)) for _ in range(subscribers)]
        await asyncio.sleep(1.0)  # the subscribers hold (or wait for) every pooled connection now
        body = {"job": "crowd", "tasks": [task("t1")], "group_size": 2}
        async with session.post(api + "/rollouts", json=body, headers=auth(token)) as response:
            submitted = response.status
        return list(await asyncio.gather(*readers)), submitted


@pytest.mark.slow
def test_300_subscribers_on_a_100_connection_pool_and_a_submission(tmp_path: Path, redis_url: str) -> None:
    # each subscriber holds a pooled connection for its first XREAD BLOCK: 2 s, so that 300 of them crowd
    # 100 connections even when a loaded host's API takes them in at 50 a second (with 500 ms, a
    # fresh-clone run once counted no wait at all)
    api = start_api(redis_url, tmp_path, ROLLOUT_API_SSE_BLOCK_MS="2000", ROLLOUT_API_SSE_CONNECTIONS="100")
    try:
        with httpx.Client(base_url=api.url, timeout=30) as client:
            token = create_job(client, "crowd")
            statuses, submitted = asyncio.run(crowd_and_submit(api.url, token, 300))
            assert submitted == 202
            assert statuses == [200] * 300  # every subscriber got its keep-alives; none got a 5xx
            text = client.get("/metrics").text
    finally:
        api.stop()
    assert metric(text, "rollout_redis_pool_limit", service="api", pool="streams") == 100
    assert metric(text, "rollout_redis_pool_waits_total", pool="streams") > 0  # the pool made them wait
    assert metric(text, "rollout_redis_pool_wait_timeouts_total", pool="streams") == 0
    assert metric(text, "rollout_redis_pool_limit", pool="commands") >= 1
    assert "process_open_fds" in text and "process_max_fds" in text
    assert "rollout_api_http_pool_limit 256.0" in text  # the template check's HTTP pool: sized, not httpx's 100
    assert metric(text, "rollout_api_http_pool_connections", state="in_use") >= 0


@pytest.mark.slow
def test_an_idle_subscriber_stays_connected_for_60_s_with_keepalives(tmp_path: Path, redis_url: str) -> None:
    """Default settings: XREAD BLOCK 5 s; redis-py's own default socket timeout (5 s) used to end it."""
    api = start_api(redis_url, tmp_path)
    try:
        with httpx.Client(base_url=api.url, timeout=30) as client:
            token = create_job(client, "idle")
        with (
            httpx.Client(base_url=api.url, timeout=httpx.Timeout(30, read=20)) as client,
            client.stream("GET", "/jobs/idle/trajectories", headers=auth(token)) as response,
        ):
            assert response.status_code == 200
            keepalives = 0
            for line in response.iter_lines():
                keepalives += line.startswith(": keep-alive")
                if keepalives >= 12:  # 12 empty 5 s reads: a minute on an open stream
                    break
        assert keepalives == 12
        assert "Traceback" not in api.log()
    finally:
        api.stop()


def test_redis_outage_is_503_with_retry_after(tmp_path: Path) -> None:
    server = EmbeddedRedis()
    server.start()
    api = start_api(server.url, tmp_path)
    try:
        with httpx.Client(base_url=api.url, timeout=30) as client:
            token = create_job(client, "away")
            server.stop()
            for response in (client.get("/jobs/away", headers=auth(token)), client.get("/healthz")):
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "store_unavailable"
                assert int(response.headers["Retry-After"]) >= 1
            restarted = EmbeddedRedis(port=server.port, password=server.password)  # the same server, back
            restarted.start()
            try:
                assert client.post("/jobs", json={"job": "back"}, headers=auth(ADMIN)).status_code == 201
            finally:
                restarted.stop()
    finally:
        api.stop()
        server.stop()

"""Slowloris against the real API process (issue 29): 100 connections on loopback that send their
headers or their body a byte at a time, and some that send nothing at all, are closed by the server
once the limits this test sets pass; other clients are served all the while; ``/metrics`` counts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from services.runtime.redis_server import EmbeddedRedis
from tests.support.processes import ServiceProcess, start_service
from tests.support.slowloris import GIVE_UP_S, SLOW, metric, siege


@pytest.fixture(scope="module")
def api(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    env = {"ROLLOUT_API_ADMIN_TOKEN": "slow-admin", "ROLLOUT_API_HTTP_HEADER_TIMEOUT_S": "1",
           "ROLLOUT_API_HTTP_BODY_TIMEOUT_S": "1", "ROLLOUT_API_HTTP_KEEPALIVE_S": "1"}  # fmt: skip
    service = start_service(
        ["-m", "services.cli", "api", "--port", "{port}", "--redis-url", redis_server.url],
        log_dir=tmp_path_factory.mktemp("api-slow-logs"), env=env, name="api",
    )  # fmt: skip
    yield service
    service.stop()


def test_slow_clients_are_cut_and_others_served(api: ServiceProcess) -> None:
    closed, served = asyncio.run(siege(api.port, api.url))
    assert all(closed), f"{closed.count(False)} slow connections were never closed"
    assert served and set(served) == {200}  # other clients were served while the slow ones were held
    with httpx.Client(base_url=api.url, timeout=10) as client:
        text = client.get("/metrics").text
    assert metric(text, 'rollout_api_http_connections_cut_total{phase="header"}') >= SLOW // 2 + 5
    assert metric(text, 'rollout_api_http_connections_cut_total{phase="body"}') >= SLOW // 2
    assert metric(text, 'rollout_api_http_client_timeout_seconds{phase="header"}') == 1.0
    assert metric(text, "rollout_api_http_connections_open") >= 1  # this one


def test_an_idle_kept_alive_connection_is_closed(api: ServiceProcess) -> None:
    with httpx.Client(base_url=api.url, timeout=10) as client:
        before = metric(client.get("/metrics").text, 'rollout_api_http_connections_cut_total{phase="idle"}')

    async def idle() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b'{"status":"ok"}')
        closed = await asyncio.wait_for(reader.read(), GIVE_UP_S) == b""  # then nothing more is sent
        writer.close()
        return closed

    assert asyncio.run(idle())
    with httpx.Client(base_url=api.url, timeout=10) as client:
        after = metric(client.get("/metrics").text, 'rollout_api_http_connections_cut_total{phase="idle"}')
    assert after >= before + 1

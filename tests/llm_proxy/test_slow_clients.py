"""Slowloris against the real proxy (two SO_REUSEPORT processes; the gateway shares its server): 100
connections that trickle their headers or their body, and some silent ones, are closed once the
limits this test sets pass, while other clients are served; ``/metrics`` counts them (issue 29)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.fleet import DEV_ENV
from tests.support.processes import ServiceProcess, start_service
from tests.support.slowloris import SLOW, metric, siege


@pytest.fixture(scope="module")
def proxy(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    env = {"ROLLOUT_REDIS_URL": redis_server.url, "ROLLOUT_PROXY_HTTP_HEADER_TIMEOUT_S": "1",
           "ROLLOUT_PROXY_HTTP_BODY_TIMEOUT_S": "1", "ROLLOUT_PROXY_HTTP_KEEPALIVE_S": "1", **DEV_ENV}  # fmt: skip
    service = start_service(["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "2"],
                            log_dir=tmp_path_factory.mktemp("proxy-slow-logs"), env=env, name="proxy")  # fmt: skip
    yield service
    service.stop()


def test_slow_clients_are_cut_and_others_served(proxy: ServiceProcess) -> None:
    closed, served = asyncio.run(siege(proxy.port, proxy.url, b"/v1/chat/completions"))
    assert all(closed), f"{closed.count(False)} slow connections were never closed"
    assert served and set(served) == {200}
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        text = client.get("/metrics").text
    assert metric(text, 'rollout_proxy_http_connections_cut_total{phase="header"}') >= SLOW // 2 + 5
    assert metric(text, 'rollout_proxy_http_connections_cut_total{phase="body"}') >= SLOW // 2
    assert metric(text, 'rollout_proxy_http_client_timeout_seconds{phase="body"}') == 1.0
    assert metric(text, "rollout_proxy_http_connections_open") >= 1

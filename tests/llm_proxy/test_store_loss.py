"""A Redis that comes back empty (issue 29): the proxy's parent notices that the store lost its
generation, says so once, and registers its configured pools and engines again, where every call
used to get 404 ``unknown_pool`` until the proxy was restarted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.protocol import keys
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.fleet import DEV_ENV, FAST_ENGINE, generate, start_engines, wait_until
from tests.support.processes import ServiceProcess, start_service

CALL = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}


@pytest.fixture
def proxy(redis_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    engines, urls = start_engines(tmp_path / "logs", 1)
    env = {"ROLLOUT_REDIS_URL": redis_url, "ROLLOUT_PROXY_STORE_CHECK_S": "0.5", **DEV_ENV}
    service = None
    try:
        service = start_service(["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "2", "--engines",
                                 urls[0], "--health-interval-s", "0.2"], log_dir=tmp_path / "logs", env=env,
                                name="proxy")  # fmt: skip
        yield service
    finally:
        if service is not None:
            service.stop()
        engines.stop()


def test_the_proxy_registers_its_pools_again_when_redis_comes_back_empty(
    proxy: ServiceProcess, redis_server: EmbeddedRedis
) -> None:
    wait_until(lambda: generate(proxy.url, CALL).status_code == 200, what="the engine to serve")
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()  # what a restart without persistence leaves
        wait_until(lambda: "Redis lost its state" in proxy.log(), what="the proxy to notice")
        wait_until(lambda: client.hexists(keys.proxy_state(), "pool:default"), what="the pool registered again")
        wait_until(lambda: generate(proxy.url, CALL).status_code == 200, what="the pool to serve")
    finally:
        client.close()
    assert proxy.log().count("Redis lost its state") == 1  # said once


def _pool_urls(proxy_url: str, pool: str) -> set[str]:
    doc = httpx.get(proxy_url + "/admin/status", timeout=10).json()
    return {e["url"] for e in doc["pools"].get(pool, {}).get("engines", [])}


def test_engines_that_joined_by_themselves_join_again(proxy: ServiceProcess, redis_server: EmbeddedRedis,
                                                      tmp_path: Path) -> None:  # fmt: skip
    """Only the engines of the proxy's own configuration came back; an engine that registered
    itself (``--proxy-url``) was gone for good. Now it joins again, once; one removed by an
    operator in the same store stays out."""
    env = {"ROLLOUT_ENGINE_REJOIN_CHECK_S": "0.3"}
    joining = start_service(["-m", "services.cli", "engine", "--port", "{port}", "--proxy-url", proxy.url, "--pool",
                             "joined", *FAST_ENGINE], log_dir=tmp_path / "logs", env=env, name="joining")  # fmt: skip
    client = redis.Redis.from_url(redis_server.url)
    try:
        url = f"http://127.0.0.1:{joining.port}"
        wait_until(lambda: _pool_urls(proxy.url, "joined") == {url}, what="the engine to join")
        client.flushall()
        # bounds for a loaded machine: the proxy must notice the loss before the engine can (one run at
        # load ~117 took more than 15 s)
        wait_until(lambda: _pool_urls(proxy.url, "joined") == {url}, 60, "the engine to join again")
        wait_until(lambda: "store_lost" in httpx.get(proxy.url + "/healthz").json(), 60, "/healthz to say it")
        assert joining.log().count("joining pool joined again") == 1
        joined_pool = {"X-Pool": "joined"}
        wait_until(lambda: generate(proxy.url, CALL, joined_pool).status_code == 200, what="the pool to serve")

        removed = httpx.post(proxy.url + "/admin/engines/remove", json={"url": url}, timeout=10)
        assert removed.status_code == 200, removed.text
        time.sleep(1.5)  # five of the engine's checks
        assert url not in _pool_urls(proxy.url, "joined") and joining.log().count("joining pool joined again") == 1
    finally:
        client.close()
        joining.stop()

"""Overload through a real proxy: calls past every engine's slots wait in the visible, bounded queue;
past its bound a call gets 503 ``capacity_exhausted`` with Retry-After; every queued call finishes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import httpx
import pytest

from services.protocol import ErrorCode
from tests.llm_proxy.fleet import start_engines, start_proxy, wait_until

pytestmark = pytest.mark.e2e

SLOW = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 10, "ignore_eos": True}}


def _metrics(url: str) -> dict[str, float]:
    found = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def _sum(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


async def _call(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object], str | None]:
    async with http.post(url + "/generate", json=SLOW) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def _overload(url: str) -> tuple[list[tuple[int, dict[str, object], str | None]], dict[str, float]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        running = [asyncio.create_task(_call(http, url)) for _ in range(2)]  # the engine's two slots
        await asyncio.to_thread(wait_until, lambda: _sum(_metrics(url), "rollout_proxy_calls_in_flight{") == 2,
                                30, "two calls on the engine")  # fmt: skip
        queued = [asyncio.create_task(_call(http, url)) for _ in range(3)]
        await asyncio.to_thread(wait_until, lambda: _metrics(url).get("rollout_proxy_queue_depth") == 3,
                                30, "three calls queued")  # fmt: skip
        seen = _metrics(url)
        refused = await _call(http, url)
        return [refused, *await asyncio.gather(*running, *queued)], seen


def test_overload_queues_visibly_then_refuses_with_a_code(tmp_path: Path, redis_url: str) -> None:
    engine, urls = start_engines(tmp_path / "logs", 1, "--decode-step-s", "0.5")
    proxy = None
    try:
        proxy = start_proxy(tmp_path / "logs", redis_url, urls, "--workers", "1", "--engine-max-in-flight", "2",
                            "--queue-max-calls", "3")  # fmt: skip
        (refused, *served), seen = asyncio.run(_overload(proxy.url))
        assert seen['rollout_proxy_limit{limit="queue_calls"}'] == 3
        assert seen['rollout_proxy_limit{limit="engine_in_flight"}'] == 2
        assert seen['rollout_proxy_limit{limit="upstream_connections"}'] == 0  # none, and said so
        status, body, retry_after = refused
        assert status == 503 and retry_after is not None and int(retry_after) >= 1
        assert body["error"]["code"] == ErrorCode.CAPACITY_EXHAUSTED.value  # type: ignore[index]
        assert [s for s, _, _ in served] == [200] * 5  # nothing queued is lost
        after = _metrics(proxy.url)
        assert after["rollout_proxy_queue_depth"] == 0
        assert after['rollout_proxy_queue_waits_total{outcome="admitted"}'] == 3
        assert after['rollout_proxy_queue_waits_total{outcome="full"}'] == 1
    finally:
        if proxy is not None:
            proxy.stop()
        engine.stop()

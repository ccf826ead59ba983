"""The weight-update transaction across real engines, with calls in flight and one engine failing."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from services.protocol import llm as h
from services.protocol.weights import WeightUpdate, WeightUpdateResult
from tests.llm_proxy.fleet import DEV_ENV, engine_states, generate, start_engines, start_proxy, wait_until
from tests.support.processes import ServiceProcess, start_service

pytestmark = pytest.mark.e2e

CALL = {"input_ids": [2, 3, 4], "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}


async def _calls(proxy: str, n: int) -> list[tuple[int, dict[str, Any]]]:
    async with aiohttp.ClientSession() as session:

        async def one() -> tuple[int, dict[str, Any]]:
            async with session.post(proxy + "/generate", json=CALL) as resp:
                return resp.status, await resp.json()

        return list(await asyncio.gather(*(one() for _ in range(n))))


def _updating(proxy: str) -> bool:
    return bool(httpx.get(proxy + "/admin/status").json()["pools"]["default"]["updating"])


def test_weight_update_with_a_failing_engine_fails_no_call(tmp_path: Path, redis_url: str) -> None:
    logs = tmp_path / "logs"
    weights = tmp_path / "weights-v1"
    weights.mkdir()
    # the good engines load for 2 s: the second lot of calls, started once the update is under way,
    # arrives while it holds calls even on a loaded machine (at 0.2 s it once came after)
    good, good_urls = start_engines(logs, 2, "--weight-load-s", "2", name="good")
    bad, bad_urls = start_engines(logs, 1, "--fail-weight-updates", name="bad")
    proxy: ServiceProcess | None = None
    try:
        proxy = start_proxy(logs, redis_url, good_urls + bad_urls)
        url = proxy.url
        before: list[tuple[int, dict[str, Any]]] = []
        during: list[tuple[int, dict[str, Any]]] = []
        first = threading.Thread(target=lambda: before.extend(asyncio.run(_calls(url, 24))))
        first.start()
        wait_until(lambda: engine_states(url)[good_urls[0][7:]]["in_flight"] != 0 or not first.is_alive(), 15)

        update = WeightUpdate(pool="default", version="v1", location=str(weights), checksum="sha256:00")
        verdict: list[WeightUpdateResult] = []

        def post_update() -> None:
            resp = httpx.post(url + "/admin/weights", json=update.model_dump(), timeout=60)
            verdict.append(WeightUpdateResult.model_validate(resp.json()))

        updater = threading.Thread(target=post_update)
        updater.start()
        wait_until(lambda: _updating(url) or not updater.is_alive(), 15, "the update to start")
        second = threading.Thread(target=lambda: during.extend(asyncio.run(_calls(url, 24))))
        second.start()
        for t in (updater, first, second):
            t.join(timeout=60)

        assert [status for status, _ in before + during] == [200] * 48  # no call failed
        (result,) = verdict
        bad_id = bad_urls[0][7:]
        assert result.ok is False and result.quarantined == [bad_id]
        by_engine = {e.engine_id: e for e in result.engines}
        assert all(by_engine[u[7:]].ok and by_engine[u[7:]].version == "v1" for u in good_urls)
        assert "update_weights_from_disk" in (by_engine[bad_id].error or "")
        assert result.held_calls >= 1 and result.held_s > 0

        wait_until(lambda: all(engine_states(url)[bad_id]["state"] == "quarantined" for _ in range(6)))
        after = [generate(url, {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}) for _ in range(8)]
        assert {a.headers[h.HEADER_WEIGHT_VERSION] for a in after} == {"v1"}
        assert {a.json()["meta_info"]["weight_version"] for a in after} == {"v1"}
        assert bad_id not in {a.headers[h.HEADER_ENGINE] for a in after}
        status = httpx.get(url + "/admin/status").json()["pools"]["default"]
        assert status["version"] == "v1" and status["location"] == str(weights)
    finally:
        if proxy is not None:
            proxy.stop()
        good.stop()
        bad.stop()


def test_second_concurrent_update_of_a_pool_is_refused(tmp_path: Path, redis_url: str) -> None:
    logs = tmp_path / "logs"
    engines, urls = start_engines(logs, 1, "--weight-load-s", "1.0", name="slow")
    proxy: ServiceProcess | None = None
    try:
        proxy = start_proxy(logs, redis_url, urls)
        body = {"pool": "default", "version": "v2", "location": str(tmp_path), "checksum": "sha256:00"}
        first: list[httpx.Response] = []
        t = threading.Thread(
            target=lambda: first.append(httpx.post(proxy.url + "/admin/weights", json=body, timeout=30))
        )
        t.start()
        wait_until(lambda: _updating(proxy.url), 15, "the first update to start")
        second = httpx.post(proxy.url + "/admin/weights", json={**body, "version": "v3"}, timeout=30)
        t.join(timeout=30)
        assert second.status_code == 409 and second.json()["error"]["code"] == "conflict"
        assert first[0].status_code == 200 and first[0].json()["ok"] is True
    finally:
        if proxy is not None:
            proxy.stop()
        engines.stop()


def test_pools_are_separate_and_a_moved_engine_loads_the_target_weights(tmp_path: Path, redis_url: str) -> None:
    logs = tmp_path / "logs"
    engines, urls = start_engines(logs, 3, name="pooled")
    proxy: ServiceProcess | None = None
    try:
        proxy = start_service(
            ["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "2",
             "--pools", f"a={urls[0]},{urls[1]};b={urls[2]}"],
            log_dir=logs, name="proxy", env={"ROLLOUT_REDIS_URL": redis_url, **DEV_ENV},
        )  # fmt: skip
        body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
        update = {"pool": "b", "version": "b-7", "location": str(tmp_path), "checksum": "sha256:00"}
        assert httpx.post(proxy.url + "/admin/weights", json=update, timeout=30).json()["ok"] is True

        moved = httpx.post(proxy.url + "/admin/engines/move", json={"url": urls[1], "pool": "b"}, timeout=60)
        assert moved.status_code == 200
        assert httpx.get(urls[1] + "/get_model_info").json()["weight_version"] == "b-7"
        wait_until(lambda: all(len(_pool_engines(proxy.url, "b")) == 2 for _ in range(6)), 15, "the move")

        in_b = [generate(proxy.url, body, {h.HEADER_POOL: "b"}) for _ in range(12)]
        assert {r.headers[h.HEADER_WEIGHT_VERSION] for r in in_b} == {"b-7"}
        assert {r.headers[h.HEADER_ENGINE] for r in in_b} <= {urls[1][7:], urls[2][7:]}
        in_a = {generate(proxy.url, body, {h.HEADER_POOL: "a"}).headers[h.HEADER_ENGINE] for _ in range(6)}
        assert in_a == {urls[0][7:]}
    finally:
        if proxy is not None:
            proxy.stop()
        engines.stop()


def _pool_engines(proxy: str, pool: str) -> list[str]:
    return [e["engine_id"] for e in httpx.get(proxy + "/admin/status").json()["pools"][pool]["engines"]]

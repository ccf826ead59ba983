"""Engines join their proxy pool when they are up and leave it when they stop; ``--mode sglang``
starts SGLang with the platform's flags (a stand-in ``sglang`` package here: SGLang needs a GPU)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from services.engines import registration
from services.engines.settings import EngineSettings
from services.engines.sglang import sglang_argv
from services.runtime.net import free_port_range
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.fleet import start_engines, start_proxy, wait_until
from tests.support.processes import start_service

FAKE_SGLANG = Path(__file__).parent / "fake_sglang"


def engine_states(proxy_url: str, pool: str) -> set[str]:
    """The engine ids of ``pool`` in the proxy's ``/admin/status`` (empty while the pool does not exist)."""
    doc = httpx.get(proxy_url + "/admin/status", timeout=10).json()
    return {e["engine_id"] for e in doc["pools"].get(pool, {}).get("engines", [])}


def test_sglang_command_line_carries_the_platform_flags() -> None:
    settings = EngineSettings(
        mode="sglang", model_path=Path("/models/policy"), host="10.0.0.7", port=30001, context_length=32768,
        served_model_name="policy", weight_version="7", tp_size=2, mem_fraction_static=0.8,
        return_routed_experts=True, sglang_args=["--disable-radix-cache"],
    )  # fmt: skip
    argv = sglang_argv(settings, python="python3")
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model-path"] == "/models/policy" and flags["--port"] == "30001"
    assert flags["--context-length"] == "32768" and flags["--weight-version"] == "7" and flags["--tp-size"] == "2"
    assert {"--enable-metrics", "--enable-return-routed-experts", "--disable-radix-cache"} <= set(argv)
    with pytest.raises(ValueError, match="model_path"):
        sglang_argv(EngineSettings(mode="sglang"))


def test_the_store_generation_is_read_before_the_join(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store lost between the join and the first read of its generation must still bring the
    engine back: the generation the engine compares against is the one from before it joined."""
    pools: dict[str, list[dict[str, str]]] = {}
    status = {"store_generation": "g1", "pools": pools}
    calls: list[str] = []

    def fake_status(_settings: EngineSettings) -> dict[str, object]:
        calls.append("status")
        return dict(status)

    def fake_post(_settings: EngineSettings, path: str, body: dict[str, str]) -> None:
        calls.append(path)
        pools["p"] = [{"url": body["url"]}]
        status["store_generation"] = "g2"  # the store is lost and restored right after the join
        pools.clear()

    monkeypatch.setattr(registration, "_status", fake_status)
    monkeypatch.setattr(registration, "_post", fake_post)
    settings = EngineSettings(port=40001, proxy_url="http://127.0.0.1:9", pool="p", rejoin_check_s=3600)

    async def join() -> None:
        task = await registration.join_and_watch(settings)
        assert task is not None
        task.cancel()

    asyncio.run(join())
    assert calls == ["status", "/admin/engines"]
    membership = registration.Membership(settings)
    membership.generation = "g1"
    assert membership.check() == {"http://127.0.0.1:40001"}  # joined again in g2
    assert calls[-1] == "/admin/engines"


@pytest.mark.e2e
def test_engines_join_their_pool_and_leave_it(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    base, urls = start_engines(tmp_path, 1)
    services = [base]
    try:
        proxy = start_proxy(tmp_path, redis_server.url, urls)
        services.insert(0, proxy)
        joining, joined = start_engines(tmp_path, 2, "--proxy-url", proxy.url, "--pool", "joined", name="joining")
        services.insert(0, joining)
        ids = {u.removeprefix("http://") for u in joined}
        wait_until(lambda: engine_states(proxy.url, "joined") == ids, what="engines in pool joined")
        joining.stop()
        wait_until(lambda: not engine_states(proxy.url, "joined"), what="engines gone from pool joined")
    finally:
        for svc in services:
            svc.stop()


@pytest.mark.e2e
def test_sglang_mode_starts_the_server_joins_and_stops_it(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    base, urls = start_engines(tmp_path, 1)
    services = [base]
    try:
        proxy = start_proxy(tmp_path, redis_server.url, urls)
        services.insert(0, proxy)
        record, port = tmp_path / "sglang-args.json", free_port_range(2)  # the server's port, then the stage port
        env = {
            "PYTHONPATH": f"{FAKE_SGLANG}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "FAKE_SGLANG_RECORD": str(record),
        }
        launcher = start_service(
            ["-m", "services.cli", "engine", "--mode", "sglang", "--model-path", str(tmp_path), "--port", str(port),
             "--context-length", "4096", "--proxy-url", proxy.url, "--pool", "gpu", "--", "--log-level", "warning"],
            log_dir=tmp_path, name="launcher", env=env, port=port, health_path="/health",
        )  # fmt: skip
        services.insert(0, launcher)
        wait_until(lambda: f"127.0.0.1:{port}" in engine_states(proxy.url, "gpu"), what="the SGLang engine in pool gpu")
        args = json.loads(record.read_text())
        assert (
            args["context_length"] == 4096 and args["enable_metrics"] and args["unknown"] == ["--log-level", "warning"]
        )
        os.killpg(launcher.proc.pid, signal.SIGTERM)
        assert launcher.proc.wait(timeout=30) is not None
        wait_until(lambda: not engine_states(proxy.url, "gpu"), what="the SGLang engine gone from pool gpu")
    finally:
        for svc in services:
            svc.stop()

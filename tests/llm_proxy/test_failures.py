"""Engine failures: a killed engine is retried around, ejected, and rejoins when it is back; the
field's runaway-generation failure, reproduced without the context guard and prevented with it."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import httpx
import pytest

from services.llm_proxy.routing import affinity_score
from services.protocol import llm as h
from tests.llm_proxy.fleet import DEV_ENV, engine_states, generate, start_engines, start_proxy, wait_until
from tests.support.processes import ServiceProcess, start_service

pytestmark = pytest.mark.e2e


def _session_for(engine_id: str, engine_ids: list[str]) -> str:
    """A session id whose rendezvous hash picks ``engine_id``."""
    for i in range(10_000):
        session = f"traj-{i}"
        if max(engine_ids, key=lambda e: affinity_score(session, e)) == engine_id:
            return session
    raise AssertionError("no session found")


def test_killed_engine_is_retried_ejected_and_rejoins(tmp_path: Path, redis_url: str) -> None:
    logs = tmp_path / "logs"
    stable, stable_urls = start_engines(logs, 2, name="stable")
    victim, victim_urls = start_engines(logs, 1, name="victim")
    proxy: ServiceProcess | None = None
    restarted: ServiceProcess | None = None
    try:
        urls = stable_urls + victim_urls
        proxy = start_service(
            ["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "2", "--engines", ",".join(urls),
             "--health-interval-s", "1.0", "--eject-after-failures", "3"],
            log_dir=logs, name="proxy", env={"ROLLOUT_REDIS_URL": redis_url, **DEV_ENV},
        )  # fmt: skip
        ids = [u[len("http://") :] for u in urls]
        victim_id = ids[2]
        session = _session_for(victim_id, ids)
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
        assert generate(proxy.url, body, {h.HEADER_SESSION: session}).headers[h.HEADER_ENGINE] == victim_id

        victim.kill(signal.SIGKILL)
        answers = [generate(proxy.url, body, {h.HEADER_SESSION: session}) for _ in range(4)]
        answers += [generate(proxy.url, body) for _ in range(12)]
        assert [a.status_code for a in answers] == [200] * 16  # refused connections went elsewhere
        assert victim_id not in {a.headers[h.HEADER_ENGINE] for a in answers}
        assert "rollout_proxy_retries_total" in httpx.get(proxy.url + "/metrics").text
        wait_until(lambda: all(engine_states(proxy.url)[victim_id]["ejected"] for _ in range(6)), 20, "ejection")

        restarted = start_service(
            ["-m", "services.cli", "engine", "--port", "{port}", "--decode-step-s", "0.005"],
            log_dir=logs, port=victim.port, name="victim-again",
        )  # fmt: skip
        wait_until(lambda: not any(engine_states(proxy.url)[victim_id]["ejected"] for _ in range(6)), 20, "rejoin")

        def back_home() -> bool:  # each of the 2 processes readmits at its own health check, and 6 status
            # reads may all have reached one of them: the session's calls return to the victim in both
            answers = [generate(proxy.url, body, {h.HEADER_SESSION: session}) for _ in range(6)]
            return all(a.status_code == 200 and a.headers[h.HEADER_ENGINE] == victim_id for a in answers)

        wait_until(back_home, 20, "the session's affinity restored")
    finally:
        if proxy is not None:
            proxy.stop()
        for svc in (stable, victim, restarted):
            if svc is not None:
                svc.stop()


async def _runaways_and_neighbours(target: str, runaway: dict[str, object], timeout_s: float) -> list[str]:
    """Start 5 runaway generations, then 8 ordinary calls; return each ordinary call's outcome."""
    async with aiohttp.ClientSession() as session:
        runaways = [asyncio.create_task(session.post(target + "/generate", json=runaway)) for _ in range(5)]
        await asyncio.sleep(1.0)  # the runaways start first (uncapped, they fill the KV within ~0.3 s)

        async def ordinary(i: int) -> str:
            body = {"input_ids": [100 + i] * 50, "sampling_params": {"max_new_tokens": 10}}
            try:
                async with session.post(
                    target + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
                ) as resp:
                    return str(resp.status)
            except TimeoutError:
                return "timeout"

        outcomes = await asyncio.gather(*(ordinary(i) for i in range(8)))
        for task in runaways:
            task.cancel()
        await asyncio.gather(*runaways, return_exceptions=True)
    return list(outcomes)


@pytest.mark.slow
def test_runaway_generations_starve_an_engine_unless_the_guard_caps_them(tmp_path: Path, redis_url: str) -> None:
    """KV for 1,000 tokens, context 100,000: five uncapped generations fill the cache and the other
    calls queue until their timeout; through the proxy (200 new tokens per call) they all finish."""
    logs = tmp_path / "logs"
    tight = ("--kv-capacity-tokens", "1000", "--context-length", "100000", "--decode-step-s", "0.002")
    runaway: dict[str, object] = {"input_ids": [7] * 100, "sampling_params": {"ignore_eos": True}}  # no max_new_tokens

    engine, (url,) = start_engines(logs, 1, *tight, name="direct")
    try:
        direct = asyncio.run(_runaways_and_neighbours(url, runaway, timeout_s=3.0))
        httpx.post(url + "/abort_request", json={"rid": "", "abort_all": True})
    finally:
        engine.stop()
    assert direct == ["timeout"] * 8  # the field's failure

    engine, (url,) = start_engines(logs, 1, *tight, name="guarded")
    proxy = None
    try:
        proxy = start_proxy(logs, redis_url, [url], "--max-new-tokens-cap", "200")
        guarded = asyncio.run(_runaways_and_neighbours(proxy.url, runaway, timeout_s=30.0))
    finally:
        if proxy is not None:
            proxy.stop()
        engine.stop()
    assert guarded == ["200"] * 8

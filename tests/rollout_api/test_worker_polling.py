"""A worker with nothing to take backs off: its idle rounds (one XREADGROUP per job each) double
their wait from ``poll_interval_s`` up to ``poll_max_s`` instead of polling every job at 20 Hz."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import redis
from redis.asyncio import Redis

from services.protocol import keys
from services.protocol.api import JobQuotas
from services.rollout_api.records import JobRecord
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker.agent import AgentDeps
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.proxy_client import ProxyClient
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.worker import Worker
from services.runtime.tokenizer import write_tokenizer_dir

NOWHERE = "http://127.0.0.1:9"  # never called: there is no work


def xreadgroup_calls(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    return int(stats.get("cmdstat_xreadgroup", {}).get("calls", 0))


async def idle_rounds(redis_url: str, tokenizer_dir: Path, seconds: float, **settings: Any) -> int:
    """XREADGROUPs an idle worker sends in ``seconds`` for one job with an empty work stream."""
    sync = redis.Redis.from_url(redis_url)
    record = JobRecord("idle", "default", 1.0, JobQuotas(max_queued=100, max_in_flight=10))
    mapping: dict[Any, Any] = record.to_hash("x", 0.0)
    sync.hset(keys.job_record("idle"), mapping=mapping)
    sync.sadd(keys.jobs_index(), "idle")
    client = Redis.from_url(redis_url)
    conf = WorkerSettings(redis_url=redis_url, model_path=tokenizer_dir, **settings)
    async with aiohttp.ClientSession() as session:
        deps = AgentDeps(proxy=ProxyClient(session, NOWHERE, 1.0), broker=BrokerClient(session, NOWHERE, 1.0),
                         tokenizer=ChatTokenizer.from_dir(tokenizer_dir), settings=conf, worker_id="w1",
                         metrics=WorkerMetrics(conf.concurrency))  # fmt: skip
        worker = Worker(client, deps, deps.metrics)
        await worker.refresh_jobs()
        before = xreadgroup_calls(sync)
        fill = asyncio.create_task(worker._fill())
        await asyncio.sleep(seconds)
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(fill, 5)
    await client.aclose()
    rounds = xreadgroup_calls(sync) - before
    sync.close()
    return rounds


def test_an_idle_worker_backs_off(redis_url: str, tmp_path: Path) -> None:
    model = write_tokenizer_dir(tmp_path / "model")
    # 2 s idle: waits of 0.05, 0.1, 0.2, 0.4, 0.4, ... are about 7 rounds; polling at 0.05 s would be 40
    backing_off = asyncio.run(idle_rounds(redis_url, model, 2.0, poll_interval_s=0.05, poll_max_s=0.4))
    assert 3 <= backing_off <= 12
    # with the cap at the first wait, the worker polls every 0.05 s as before: the count above is the backoff's
    steady = asyncio.run(idle_rounds(redis_url, model, 2.0, poll_interval_s=0.05, poll_max_s=0.05))
    assert steady >= 25

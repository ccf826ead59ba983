"""A real worker in the test's own process against real Redis, for the tests of what it takes,
reclaims and moves to the dead letters. The proxy and the broker are a closed port: an episode that
runs fails at once as an infra error (after its one attempt), which is how a test tells that it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import redis
from redis.asyncio import Redis

from services.protocol import Task, Trajectory, WorkItem, keys
from services.protocol.api import JobQuotas
from services.protocol.keys import WORKERS_GROUP
from services.protocol.trajectory import from_stream_fields
from services.rollout_api.records import JobRecord
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker.agent import AgentDeps
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.proxy_client import ProxyClient
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.worker import Worker

NOWHERE = "http://127.0.0.1:9"  # connection refused: an episode that runs fails at once
JOB = "dl"
FAST = {"poll_interval_s": 0.02, "poll_max_s": 0.05, "reclaim_idle_s": 0.2, "reclaim_interval_s": 0.1,
        "heartbeat_s": 0.1, "retry_backoff_s": 0.01, "jobs_refresh_s": 0.2}  # fmt: skip


def setup_job(client: redis.Redis, max_in_flight: int = 10) -> None:
    record = JobRecord(JOB, "default", 1.0, JobQuotas(max_queued=100, max_in_flight=max_in_flight))
    mapping: dict[Any, Any] = record.to_hash("x", 0.0)
    client.hset(keys.job_record(JOB), mapping=mapping)
    client.sadd(keys.jobs_index(), JOB)
    client.xgroup_create(keys.work_stream(JOB), WORKERS_GROUP, id="0", mkstream=True)


async def admit(redis_url: str, rollout_id: str, tasks: list[Task]) -> None:
    """What ``POST /rollouts`` stores: the tasks, then the record and one entry per task (group of 1)."""
    items = [WorkItem(job=JOB, rollout_id=rollout_id, trajectory_id=WorkItem.make_trajectory_id(rollout_id, t.id, 0),
                      task=t, group_id=WorkItem.make_group_id(rollout_id, t.id), sample_index=0, group_size=1,
                      max_attempts=1) for t in tasks]  # fmt: skip
    client = Redis.from_url(redis_url)
    try:
        stored: dict[Any, Any] = {t.id: t.model_dump_json() for t in tasks}
        await client.hset(keys.rollout_tasks(JOB, rollout_id), mapping=stored)
        record = {"job": JOB, "total": str(len(items)), "tasks": str(len(tasks)), "group_size": "1",
                  "idempotency_key": "", "mode": "train"}  # fmt: skip
        admitted = await Scripts(client).admit(JOB, rollout_id, None, record,
                                               [(i.trajectory_id, i.encode()) for i in items], now=time.time(),
                                               idempotency_ttl_s=60)  # fmt: skip
        assert admitted.outcome == 1
    finally:
        await client.aclose()


def task(task_id: str, **metadata: Any) -> Task:
    return Task.model_validate({"id": task_id, "prompt": "p", "reward": {"command": "true"}, "metadata": metadata})


async def run_worker(
    redis_url: str, model: Path, done: Callable[[], bool], spy: Callable[[Worker], None] | None = None, **settings: Any
) -> WorkerMetrics:
    """Run a worker until ``done()`` (at most 30 s), then stop it; ``spy`` sees it before it starts."""
    client = Redis.from_url(redis_url)
    conf = WorkerSettings(redis_url=redis_url, model_path=model, **{"concurrency": 4, **FAST, **settings})
    async with aiohttp.ClientSession() as session:
        deps = AgentDeps(proxy=ProxyClient(session, NOWHERE, 1.0), broker=BrokerClient(session, NOWHERE, 1.0),
                         tokenizer=ChatTokenizer.from_dir(model), settings=conf, worker_id="w1",
                         metrics=WorkerMetrics(conf.concurrency))  # fmt: skip
        worker = Worker(client, deps, deps.metrics)
        if spy is not None:
            spy(worker)
        running = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline and not running.done():
            await asyncio.wait({running}, timeout=0.05)
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(running, 10)
    await client.aclose()
    return deps.metrics


def records(client: redis.Redis) -> dict[str, Trajectory]:
    """The job's published trajectories by task id."""
    entries: Any = client.xrange(keys.rollout_stream(JOB, "train"))
    return {t.task_id: t for t in (from_stream_fields(fields) for _, fields in entries)}


def dead_letters(client: redis.Redis) -> list[dict[str, str]]:
    entries: Any = client.xrange(keys.dead_letters(JOB))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def held_by_a_dead_worker(client: redis.Redis, deliveries: int) -> None:
    """Every queued entry delivered to a worker that died holding it, ``deliveries`` times so far."""
    read: Any = client.xreadgroup(WORKERS_GROUP, "dead-worker", {keys.work_stream(JOB): ">"})
    ids = [entry_id for entry_id, _ in read[0][1]]
    client.xclaim(keys.work_stream(JOB), WORKERS_GROUP, "dead-worker", 0, ids, retrycount=deliveries, justid=True)

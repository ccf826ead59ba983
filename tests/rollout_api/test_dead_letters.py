"""No item goes round forever (issue 29): one that fails outside its attempts, or that was
delivered more than ``max_deliveries`` times, goes to its job's dead letters with the reason and
the last error, is counted, and is reported on its rollout; the job's next items run.

A real Redis and a real worker in this process; the proxy and the broker are a closed port (an
episode that runs fails at once as an infra error, which is how these tests tell that it ran).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from redis.asyncio import Redis

from services.protocol import InfraStage, Status, Task, Trajectory, WorkItem, keys, to_stream_fields, work
from services.protocol.api import JobQuotas
from services.protocol.keys import WORKERS_GROUP
from services.protocol.trajectory import from_stream_fields
from services.rollout_api.records import JobRecord
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker.agent import AgentDeps
from services.rollout_api.worker.clients import BrokerClient, ProxyClient
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.worker import Worker
from services.runtime.tokenizer import write_tokenizer_dir

NOWHERE = "http://127.0.0.1:9"  # connection refused: an episode that runs fails at once
JOB = "dl"
FAST = {"poll_interval_s": 0.02, "poll_max_s": 0.05, "reclaim_idle_s": 0.2, "reclaim_interval_s": 0.1,
        "heartbeat_s": 0.1, "retry_backoff_s": 0.01, "jobs_refresh_s": 0.2}  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tokenizer_dir(tmp_path / "model")


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record whose metadata holds ``poison`` cannot be encoded, as a metadata integer past 2**64
    could not before the contract refused it: publishing it fails outside every attempt."""

    def failing(traj: Trajectory) -> dict[str, str | bytes]:
        if "poison" in traj.metadata:
            raise OverflowError("can't serialize ints < -2**63 or > 2**64 - 1")
        return to_stream_fields(traj)

    monkeypatch.setattr("services.rollout_api.publishing.to_stream_fields", failing)


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


async def run_worker(redis_url: str, model: Path, done: Callable[[], bool], **settings: Any) -> WorkerMetrics:
    """Run a worker until ``done()`` (at most 30 s), then stop it."""
    client = Redis.from_url(redis_url)
    conf = WorkerSettings(redis_url=redis_url, model_path=model, concurrency=4, **{**FAST, **settings})
    async with aiohttp.ClientSession() as session:
        deps = AgentDeps(proxy=ProxyClient(session, NOWHERE, 1.0), broker=BrokerClient(session, NOWHERE, 1.0),
                         tokenizer=ChatTokenizer.from_dir(model), settings=conf, worker_id="w1",
                         metrics=WorkerMetrics(conf.concurrency))  # fmt: skip
        worker = Worker(client, deps, deps.metrics)
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


def dead_count(metrics: WorkerMetrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("rollout_worker_dead_letters_total", {"job": JOB, "reason": reason})


def held_by_a_dead_worker(client: redis.Redis, deliveries: int) -> None:
    """Every queued entry delivered to a worker that died holding it, ``deliveries`` times so far."""
    read: Any = client.xreadgroup(WORKERS_GROUP, "dead-worker", {keys.work_stream(JOB): ">"})
    ids = [entry_id for entry_id, _ in read[0][1]]
    client.xclaim(keys.work_stream(JOB), WORKERS_GROUP, "dead-worker", 0, ids, retrycount=deliveries, justid=True)


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    setup_job(redis_client, max_in_flight=1)
    yield redis_client


@pytest.mark.usefixtures("poison")
def test_an_item_failing_outside_its_attempts_is_dead_lettered_and_the_next_runs(
    redis_url: str, client: redis.Redis, model: Path
) -> None:
    asyncio.run(admit(redis_url, f"{JOB}.r1", [task("bad", poison=1), task("next")]))
    metrics = asyncio.run(run_worker(redis_url, model, lambda: len(records(client)) == 2))
    found = records(client)
    assert set(found) == {"bad", "next"}, "an item was never reported"
    bad = found["bad"]
    assert bad.status is Status.INFRA_ERROR and bad.infra is not None and bad.infra.stage is InfraStage.WORKER
    assert "dead letters" in bad.infra.message and bad.metadata == {}  # published without what failed
    assert found["next"].status is Status.INFRA_ERROR and found["next"].infra.stage is not InfraStage.WORKER  # type: ignore[union-attr]
    [dead] = dead_letters(client)
    assert dead[work.DEAD_REASON] == work.FAILED and "serialize ints" in dead[work.DEAD_ERROR]
    assert dead[work.TRAJECTORY] == bad.trajectory_id and dead[work.DEAD_DELIVERIES] == "1"
    assert dead_count(metrics, work.FAILED) == 1
    assert client.xpending(keys.work_stream(JOB), WORKERS_GROUP)["pending"] == 0
    assert client.hget(keys.job_stats(JOB), "in_flight") == b"0"


def test_an_item_delivered_too_often_is_dead_lettered_without_running(
    redis_url: str, client: redis.Redis, model: Path
) -> None:
    asyncio.run(admit(redis_url, f"{JOB}.r2", [task("crashy")]))
    held_by_a_dead_worker(client, deliveries=5)  # the reclaim is its 6th delivery: one more than max_deliveries
    metrics = asyncio.run(run_worker(redis_url, model, lambda: bool(dead_letters(client)), max_deliveries=5))
    [dead] = dead_letters(client)
    assert dead[work.DEAD_REASON] == work.REDELIVERED and dead[work.DEAD_DELIVERIES] == "6"
    assert "max_deliveries 5" in dead[work.DEAD_ERROR]
    crashy = records(client)["crashy"]
    assert crashy.status is Status.INFRA_ERROR and crashy.infra.stage is InfraStage.WORKER  # type: ignore[union-attr]
    assert client.hget(keys.attempts(JOB), crashy.trajectory_id) is None  # never taken: never ran
    assert dead_count(metrics, work.REDELIVERED) == 1
    assert client.xpending(keys.work_stream(JOB), WORKERS_GROUP)["pending"] == 0


@pytest.mark.usefixtures("poison")
def test_a_cancelled_rollouts_reclaimed_items_never_run_again(redis_url: str, client: redis.Redis, model: Path) -> None:
    """The issue's loop: a cancelled rollout's item that cannot be published was reclaimed forever."""
    asyncio.run(admit(redis_url, f"{JOB}.r3", [task("bad", poison=1), task("fine")]))
    held_by_a_dead_worker(client, deliveries=1)
    client.hset(keys.rollout_record(JOB, f"{JOB}.r3"), "cancelled", "1")
    finished = lambda: len(records(client)) == 2 and bool(dead_letters(client))  # noqa: E731
    metrics = asyncio.run(run_worker(redis_url, model, finished))
    found = records(client)
    assert {k: t.status for k, t in found.items()} == {"bad": Status.CANCELLED, "fine": Status.CANCELLED}
    [dead] = dead_letters(client)
    assert dead[work.DEAD_REASON] == work.FAILED and dead[work.TRAJECTORY] == found["bad"].trajectory_id
    assert dead_count(metrics, work.FAILED) == 1
    assert client.xpending(keys.work_stream(JOB), WORKERS_GROUP)["pending"] == 0

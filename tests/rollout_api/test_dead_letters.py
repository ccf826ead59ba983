"""No item goes round forever (issue 29): one that fails outside its attempts, or that was
delivered more than ``max_deliveries`` times, goes to its job's dead letters with the reason and
the last error, is counted, and is reported on its rollout; the job's next items run.

A real Redis and a real worker in this process; the proxy and the broker are a closed port (an
episode that runs fails at once as an infra error, which is how these tests tell that it ran).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.protocol import InfraStage, Status, Trajectory, keys, to_stream_fields, work
from services.protocol.keys import WORKERS_GROUP
from services.rollout_api.worker.metrics import WorkerMetrics
from services.runtime.tokenizer import write_tokenizer_dir
from tests.rollout_api.inprocess import (
    JOB,
    admit,
    dead_letters,
    held_by_a_dead_worker,
    records,
    run_worker,
    setup_job,
    task,
)


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


def dead_count(metrics: WorkerMetrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("rollout_worker_dead_letters_total", {"job": JOB, "reason": reason})


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

"""Evaluation rollouts (``mode="eval"``) on a fleet of real processes, beside a training rollout of
the same job: their own stream, never the trainer's, pass@1 and pass@k from the API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.protocol import Task, Trajectory, from_stream_fields, keys
from services.protocol.tasks import AgentLimits
from services.runtime.sync_redis import open_sync_redis
from tests.rollout_api.fleet import (
    SUBMIT,
    Fleet,
    create_job,
    running_fleet,
    sse_trajectories,
    submit,
    task,
    trajectories,
    wait_finished,
)
from trainer_client.consumer import TrajectoryConsumer
from trainer_client.evaluation import EvalConfig, Evaluator

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RULES: dict[str, list[Any]] = {
    "TASK-SOLVE": ["```bash\necho 42 > answer.txt\n```", SUBMIT],
    "TASK-WRONG": ["```bash\necho 41 > answer.txt\n```", SUBMIT],
    "TASK-SLOW": [{"text": "```bash\necho 42 > answer.txt\n```", "latency_s": 0.5}, SUBMIT],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("eval-fleet"), RULES, "eval") as fleet:
        fleet.start_worker(jobs=["learner", "examiner"], concurrency=8)
        yield fleet


@pytest.mark.timeout(600)  # the first test waits for the fleet to start, which takes minutes on a loaded machine
def test_eval_rollout_beside_training_is_scored_and_never_reaches_the_trainer(fleet: Fleet) -> None:
    with fleet.client() as client:
        headers = create_job(client, "learner")
        train_tasks = [task(f"train-{i}", "TASK-SLOW") for i in range(2)]
        train = submit(client, headers, {"job": "learner", "tasks": train_tasks, "group_size": 4})
        eval_tasks = [task("solve", "TASK-SOLVE"), task("wrong", "TASK-WRONG")]
        body = {"job": "learner", "tasks": eval_tasks, "group_size": 4, "mode": "eval",
                "eval": {"k": [1, 2, 4], "seed": 11}, "sampling": {"temperature": 0}}  # fmt: skip
        evaluation = submit(client, headers, body)
        wait_finished(client, headers, train, timeout_s=300)
        wait_finished(client, headers, evaluation, timeout_s=300)

        trained = trajectories(fleet.redis_url, "learner")
        evaluated = eval_trajectories(fleet.redis_url, "learner")
        assert {t.rollout_id for t in trained} == {train} and len(trained) == 8
        assert {t.rollout_id for t in evaluated} == {evaluation} and len(evaluated) == 8
        assert {t.mode for t in trained} == {"train"} and {t.mode for t in evaluated} == {"eval"}
        assert trainer_reads(fleet.redis_url) == {t.key for t in trained}

        report = client.get(f"/rollouts/{evaluation}/eval", headers=headers).json()
        assert report["complete"] and (report["finished"], report["total"], report["seed"]) == (8, 8, 11)
        assert report["pass_at_1"] == 0.5 and report["pass_at"] == {"1": 0.5, "2": 0.5, "4": 0.5}
        assert report["tasks_scored"] == {"1": 2, "2": 2, "4": 2}
        by_task = {t["task_id"]: t for t in report["tasks"]}
        assert by_task["solve"]["rewards"] == [1.0] * 4 and by_task["solve"]["passed"] == 4
        assert by_task["wrong"]["rewards"] == [0.0] * 4 and by_task["wrong"]["pass_at"]["4"] == 0.0
        assert report["weight_versions"] == {"default": sum(len(t.turns) for t in evaluated)}
        assert client.get(f"/rollouts/{evaluation}", headers=headers).json()["mode"] == "eval"

        refused = client.get(f"/rollouts/{train}/eval", headers=headers)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "conflict"
        over_sse = sse_trajectories(client, "/jobs/learner/trajectories?mode=eval&limit=8", headers)
        assert {t.key for t in over_sse} == {t.key for t in evaluated}
        bad = client.post("/rollouts", json={**body, "eval": {"k": [5]}}, headers=headers)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error", bad.text


def eval_trajectories(redis_url: str, job: str) -> list[Trajectory]:
    client = open_sync_redis(redis_url)
    try:
        entries: Any = client.xrange(keys.eval_stream(job))
        return [from_stream_fields(fields) for _, fields in entries]
    finally:
        client.close()


def trainer_reads(redis_url: str) -> set[tuple[str, int]]:
    """What the trainer's consumer group is delivered from the job's trajectory stream."""
    consumer = TrajectoryConsumer(open_sync_redis(redis_url), "learner")
    try:
        consumer.ensure_group()
        return {e.trajectory.key for e in consumer.read(count=1000, block_ms=100) if e.trajectory is not None}
    finally:
        consumer.client.close()


def test_the_trainers_evaluator_submits_an_eval_rollout_and_reads_the_apis_report(fleet: Fleet) -> None:
    with fleet.client() as client:
        token = create_job(client, "examiner")["Authorization"].removeprefix("Bearer ")
    config = EvalConfig(job="examiner", token=token, samples=2, temperature=0, seed=3)
    tasks = [Task.model_validate(task("solve", "TASK-SOLVE")), Task.model_validate(task("wrong", "TASK-WRONG"))]
    evaluator = Evaluator(config, fleet.api.url, AgentLimits(), tasks)
    try:
        record = evaluator.evaluate("sft", 7, 0, "7-e1")
    finally:
        evaluator.close()
    assert (record.pass_at_1, record.pass_at_k, record.k) == (0.5, 0.5, 2)
    assert (record.tasks, record.trajectories, record.infra_errors) == (2, 4, 0)
    assert record.by_status["completed"] == 4 and record.versions == ["default"]
    assert {t.mode for t in eval_trajectories(fleet.redis_url, "examiner")} == {"eval"}
    assert trajectories(fleet.redis_url, "examiner") == []  # nothing for a trainer


def test_unknown_rollout_has_no_report(fleet: Fleet) -> None:
    with fleet.client() as client:
        headers = create_job(client, "nobody")
        missing = client.get("/rollouts/nobody.0123456789abcdef/eval", headers=headers)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_reports_are_per_job(fleet: Fleet) -> None:
    with fleet.client() as client:
        other = create_job(client, "stranger")
        answer = client.get("/rollouts/learner.0123456789abcdef/eval", headers=other)
        assert answer.status_code == 403, answer.text

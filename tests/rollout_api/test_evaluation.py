"""pass@k and the evaluation report, as plain functions; evaluation requests as the API admits them."""

from __future__ import annotations

import itertools
import json
from math import comb
from typing import Any

import pytest
from pydantic import ValidationError

from services.protocol import RolloutRequest, WorkItem
from services.protocol.api import SampleResult
from services.protocol.tasks import MAX_SEED
from services.rollout_api.evaluation import build_report, pass_at_k
from services.rollout_api.submission import work_items


def brute_force(n: int, c: int, k: int) -> float:
    """The share of k-subsets of the n samples that hold at least one pass."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


CASES = [(1, 0, 1), (1, 1, 1), (4, 1, 1), (4, 1, 2), (8, 3, 4), (10, 2, 5), (6, 6, 3)]


@pytest.mark.parametrize(("n", "c", "k"), CASES)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k))
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_edges() -> None:
    assert pass_at_k(3, 1, 4) is None  # fewer samples than k
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)
    assert pass_at_k(1000, 1, 100) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def sample(task: str, index: int, reward: float | None, status: str = "completed") -> SampleResult:
    return SampleResult(task_id=task, sample_index=index, status=status, reward=reward, weight_versions=["3", "4"])


def test_report_scores_only_finished_samples_and_leaves_short_tasks_out_of_pass_at_k() -> None:
    record = {"total": "8", "done": "7", "group_size": "4", "mode": "eval",
              "eval": json.dumps({"k": [2, 4], "seed": 5, "threshold": 0.5})}  # fmt: skip
    samples = [
        sample("a", 0, 1.0), sample("a", 1, 0.0), sample("a", 2, 0.6, "truncated"), sample("a", 3, 0.0),
        sample("b", 0, 0.0), sample("b", 1, None, "infra_error"), sample("b", 2, 1.0),
    ]  # fmt: skip
    report = build_report("job.r", "job", record, samples, ["a", "b"])
    a, b = report.tasks
    assert (a.samples, a.passed, a.rewards) == (4, 2, [1.0, 0.0, 0.6, 0.0])
    assert (b.samples, b.passed, b.rewards) == (2, 1, [0.0, None, 1.0, None])
    assert a.pass_at == {"1": 0.5, "2": pytest.approx(5 / 6), "4": 1.0}
    assert b.pass_at == {"1": 0.5, "2": 1.0, "4": None}
    assert report.pass_at == {"1": 0.5, "2": pytest.approx((5 / 6 + 1.0) / 2), "4": 1.0}
    assert report.pass_at_1 == 0.5 and report.tasks_scored == {"1": 2, "2": 2, "4": 1}
    assert not report.complete and (report.finished, report.seed, report.threshold) == (7, 5, 0.5)
    assert report.by_status["infra_error"] == 1 and report.weight_versions == {"3": 7, "4": 7}


def test_a_task_without_finished_samples_is_listed_but_not_scored() -> None:
    record = {"total": "2", "done": "0", "group_size": "2", "mode": "eval", "eval": "{}"}
    report = build_report("job.r", "job", record, [], ["a"])
    assert report.pass_at == {"1": None} and report.tasks[0].rewards == [None, None]


def request(tasks: int = 1, **extra: Any) -> RolloutRequest:
    docs = [{"id": f"t{i}", "prompt": "p", "reward": {"command": "true"}} for i in range(tasks)]
    return RolloutRequest.model_validate({"job": "j", "tasks": docs, "group_size": 3, **extra})


def test_eval_items_carry_their_mode_and_a_fixed_seed_per_sample() -> None:
    items = [WorkItem.decode(raw, request().tasks[0]) for _, raw in work_items(request(), "j.r", "p", 0.0)]
    assert {i.mode for i in items} == {"train"} and all("sampling_seed" not in i.sampling.model_dump() for i in items)
    evaluation = request(2, mode="eval", eval={"seed": 40}, sampling={"temperature": 0.7})
    by_id = {t.id: t for t in evaluation.tasks}
    items = [
        WorkItem.decode(raw, by_id[json.loads(raw)["task_id"]]) for _, raw in work_items(evaluation, "j.r", "p", 0.0)
    ]
    assert {i.mode for i in items} == {"eval"}
    # every sample of every task its own seed: task t, sample i -> seed + 3 t + i
    assert [(i.task.id, i.sampling.model_dump()["sampling_seed"]) for i in items] == [
        ("t0", 40), ("t0", 41), ("t0", 42), ("t1", 43), ("t1", 44), ("t1", 45)]  # fmt: skip
    assert {i.sampling.temperature for i in items} == {0.7}
    top = request(2, mode="eval", eval={"seed": MAX_SEED - 1024})
    assert top.sampling_for(2, 1000).model_dump()["sampling_seed"] == MAX_SEED - 1024 + 3002 - (MAX_SEED + 1)  # wraps


@pytest.mark.parametrize("extra", [{"eval": {"k": [1]}}, {"mode": "eval", "eval": {"k": [4]}},
                                   {"mode": "eval", "eval": {"k": [0]}}, {"mode": "test"}])  # fmt: skip
def test_bad_eval_requests_are_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        request(**extra)

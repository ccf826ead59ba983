"""Fair share across jobs (stride scheduling), as a plain unit."""

from __future__ import annotations

from collections import Counter

from services.rollout_api.worker.scheduler import FairShare


def serve(fair: FairShare, picks: int, eligible: set[str] | None = None) -> Counter[str]:
    served: Counter[str] = Counter()
    for _ in range(picks):
        job = fair.order(eligible)[0]
        fair.charge(job)
        served[job] += 1
    return served


def test_weights_are_respected() -> None:
    fair = FairShare()
    fair.set_jobs({"a": 1.0, "b": 3.0})
    served = serve(fair, 400)
    assert served == {"a": 100, "b": 300}


def test_equal_weights_alternate() -> None:
    fair = FairShare()
    fair.set_jobs({"a": 1.0, "b": 1.0, "c": 1.0})
    assert serve(fair, 9) == {"a": 3, "b": 3, "c": 3}


def test_a_job_back_from_idle_gets_no_burst() -> None:
    fair = FairShare()
    fair.set_jobs({"a": 1.0, "b": 1.0})
    fair.mark_idle("b")
    assert serve(fair, 50, eligible={"a"}) == {"a": 50}
    # b returns: from now on it shares equally instead of catching up on 50 missed turns
    assert serve(fair, 20) == {"a": 10, "b": 10}


def test_new_and_removed_jobs() -> None:
    fair = FairShare()
    fair.set_jobs({"a": 1.0})
    serve(fair, 30)
    fair.set_jobs({"a": 1.0, "new": 1.0})
    assert serve(fair, 10) == {"a": 5, "new": 5}
    fair.set_jobs({"new": 2.0})
    assert fair.jobs == ["new"]
    assert serve(fair, 3) == {"new": 3}

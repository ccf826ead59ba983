"""The demo's task family: seeded, disjoint splits, and a wrong operation never scores."""

from __future__ import annotations

from pathlib import Path

from services.fleet import shell_tasks


def test_splits_share_no_instance_and_every_wrong_operation_fails() -> None:
    train, heldout = shell_tasks.splits(seed=3, train=500, heldout=100)
    assert len(heldout) == 100 and not {p.file for p in train} & {p.file for p in heldout}
    assert shell_tasks.splits(seed=3, train=500, heldout=100) == (train, heldout)  # seeded
    for problem in heldout:
        answers = {op: shell_tasks.Problem(problem.file, problem.numbers, op, 0).answer
                   for op in shell_tasks.OPERATIONS}  # fmt: skip
        assert len(set(answers.values())) == len(answers), problem  # a wrong operation never scores


def test_the_cli_defaults_are_the_recipes() -> None:
    from services.cli import up_cmd
    from services.fleet.run import UpOptions

    o = UpOptions(work_dir=Path("."))
    cli = (up_cmd.STEPS, up_cmd.SFT_STEPS, up_cmd.HELDOUT, up_cmd.EVAL_EVERY, up_cmd.LR, up_cmd.TEACHER)
    assert cli == (o.steps, o.sft_steps, o.heldout_tasks, o.eval_every, o.lr, o.teacher_accuracy)
    assert o.concurrency == up_cmd.CONCURRENCY  # one job; --jobs N gets up_cmd.JOBS_CONCURRENCY


def test_two_jobs_get_their_own_pools_weights_and_directories_one_job_keeps_the_old_layout() -> None:
    from services.fleet.run import EVAL_JOB, JOB, UpOptions, job_specs
    from services.protocol.fields import DEFAULT_POOL

    (one,) = job_specs(UpOptions(work_dir=Path("w")))
    assert (one.name, one.eval_job, one.pool, one.trainer_dir) == (JOB, EVAL_JOB, DEFAULT_POOL, Path("w/trainer"))
    specs = job_specs(UpOptions(work_dir=Path("w"), jobs=2))
    assert [s.weight for s in specs] == [1.0, 2.0]
    for field in ("name", "eval_job", "pool", "trainer_dir"):
        assert len({getattr(s, field) for s in specs}) == 2, field
    # each job evaluates in itself, so its evaluations run under its own fair-share weight
    assert [s.eval_job for s in specs] == [s.name for s in specs]


def test_the_share_counts_what_finished_while_every_job_was_at_work() -> None:
    from services.fleet.jobs import shared_window, shares

    finished = {"a": [10.0, 11.0, 12.0, 30.0, 50.0], "b": [5.0, 12.0, 13.0, 14.0, 15.0, 20.0]}
    start, end = shared_window(finished)
    assert (start, end) == (10.0, 20.0)  # a's first .. b's last
    during = {job: sum(start <= t <= end for t in ts) for job, ts in finished.items()}
    assert during == {"a": 3, "b": 5}
    assert shares(during) == {"a": 0.375, "b": 0.625}
    assert shared_window({"a": [1.0], "b": []}) == (0.0, 0.0)  # a job that finished nothing: no window
    assert shares({"a": 0, "b": 0}) == {"a": None, "b": None}


def test_a_turn_is_foreign_when_served_outside_the_jobs_pool_or_by_weights_it_never_posted() -> None:
    from services.fleet.jobs import foreign_turns
    from tests.trainer.factories import make_trajectory

    own = make_trajectory(version="0", turns=2)  # the factory's turns are served by engine "e0"
    assert foreign_turns(own, {"e0"}, {"0", "400-e1"}) == 0
    assert foreign_turns(own, {"e1"}, {"0", "400-e1"}) == 2  # another pool's engine
    assert foreign_turns(make_trajectory(version="7-e1", turns=3), {"e0"}, {"0", "400-e1"}) == 3


def test_more_jobs_than_engines_is_refused_with_what_to_change(tmp_path: Path) -> None:
    import subprocess
    import sys

    from services.runtime.processes import REPO_ROOT, python_env

    argv = [sys.executable, "-m", "services.cli", "demo", "--work-dir", str(tmp_path), "--jobs", "3", "--engines", "2"]
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=python_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--jobs 3 needs at least that many engines" in proc.stderr


def test_engines_go_to_the_jobs_pools_by_weight_and_every_job_gets_one() -> None:
    from services.fleet.run import UpOptions, engine_pools, job_specs

    two = job_specs(UpOptions(work_dir=Path("w"), jobs=2))  # weights 1 and 2
    assert engine_pools(two, 3) == ("demo-0", "demo-1", "demo-1")
    assert engine_pools(two, 2) == ("demo-0", "demo-1")
    assert engine_pools(two, 6).count("demo-1") == 4
    assert engine_pools(job_specs(UpOptions(work_dir=Path("w"))), 2) == ("default", "default")

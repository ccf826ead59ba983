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

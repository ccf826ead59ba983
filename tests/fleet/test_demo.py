"""The demo's task family: seeded, disjoint splits, and a wrong operation never scores."""

from __future__ import annotations

from services.fleet import shell_tasks


def test_splits_share_no_instance_and_every_wrong_operation_fails() -> None:
    train, heldout = shell_tasks.splits(seed=3, train=500, heldout=100)
    assert len(heldout) == 100 and not {p.file for p in train} & {p.file for p in heldout}
    assert shell_tasks.splits(seed=3, train=500, heldout=100) == (train, heldout)  # seeded
    for problem in heldout:
        answers = {op: shell_tasks.Problem(problem.file, problem.numbers, op, 0).answer
                   for op in shell_tasks.OPERATIONS}  # fmt: skip
        assert len(set(answers.values())) == len(answers), problem  # a wrong operation never scores

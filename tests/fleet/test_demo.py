"""``rollout demo``: a tiny policy gets better at held-out shell tasks through the whole platform.

A shorter run than the default (fewer held-out tasks and GRPO steps) with the same story: pass@1
of the untrained policy, after SFT on the imperfect teacher's demonstrations, after GRPO.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.fleet import shell_tasks
from services.runtime.processes import REPO_ROOT, python_env

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_splits_share_no_instance_and_every_wrong_operation_fails() -> None:
    train, heldout = shell_tasks.splits(seed=3, train=500, heldout=100)
    assert len(heldout) == 100 and not {p.file for p in train} & {p.file for p in heldout}
    assert shell_tasks.splits(seed=3, train=500, heldout=100) == (train, heldout)  # seeded
    for problem in heldout:
        answers = {op: shell_tasks.Problem(problem.file, problem.numbers, op, 0).answer
                   for op in shell_tasks.OPERATIONS}  # fmt: skip
        assert len(set(answers.values())) == len(answers), problem  # a wrong operation never scores


@pytest.mark.timeout(900)
def test_grpo_raises_heldout_pass_at_1_over_sft(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    argv = [
        sys.executable, "-m", "services.cli", "demo", "--work-dir", str(tmp_path / "run"), "--json", str(summary),
        "--steps", "10", "--eval-every", "10", "--heldout", "64", "--seed", "1",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=python_env(), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(summary.read_text())
    assert out["heldout_tasks"] == 64 and out["steps"] == 10
    assert out["pass_at_1_base"] < 0.05  # the untrained policy solves nothing
    assert out["pass_at_1_sft"] > out["pass_at_1_base"]
    assert out["pass_at_1_rl"] - out["pass_at_1_sft"] >= 0.1, out
    evals = out["evaluations"]
    assert all(e["infra_errors"] == 0 for e in evals)
    assert all(e["versions"] == [e["version"]] for e in evals)  # every evaluated turn came from those weights

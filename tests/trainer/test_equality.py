"""Data and tensor parallel training equals one rank: DP=2, TP=2 and DP=2 x TP=2 over gloo on CPU.

Same initial weights (an HF export, each rank loading its slice), same batch, one training step:
the loss, the token figures and every updated weight match a single rank within 1e-5.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.equality_worker import BATCHING, MODEL, OPTIM, step_samples
from tests.trainer.launch import torchrun_argv, wait_all
from trainer_client.export import export_hf
from trainer_client.hf_import import load_hf_weights
from trainer_client.learner import Learner, LossConfig
from trainer_client.model import ParallelConfig, build_gpt, build_policy, init_parallel

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def torchrun(nproc: int, out: Path, init_dir: Path, sizes: str, log: Path) -> subprocess.Popen[bytes]:
    argv = torchrun_argv(nproc, "tests.trainer.equality_worker", str(out), str(init_dir), sizes)
    with log.open("wb") as f:
        return subprocess.Popen(argv, env=python_env({"OMP_NUM_THREADS": "1"}), cwd=REPO_ROOT, stdout=f,
                                stderr=subprocess.STDOUT)  # fmt: skip


def initial_weights(path: Path) -> Path:
    init_parallel(ParallelConfig(), MODEL.seed)
    model = build_gpt(MODEL, ParallelConfig())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return export_hf(model.state_dict(), MODEL, "0", path, None).path


def one_rank(init_dir: Path) -> dict[str, object]:
    from trainer_client.shards import tensors

    policy = build_policy(MODEL, ParallelConfig(), OPTIM)
    load_hf_weights(policy.module, init_dir, MODEL)
    stats = Learner(policy, LossConfig(), batching=BATCHING, optim=OPTIM).step(step_samples(), step=1)
    return {"loss": stats.loss, "tokens": stats.tokens, "ess": stats.ess, "gap": stats.logprob_gap,
            "weights": tensors(policy.module)}  # fmt: skip


@pytest.mark.timeout(240)
def test_dp2_tp2_and_dp2xtp2_equal_one_rank(tmp_path: Path) -> None:
    init_dir = initial_weights(tmp_path / "init")
    logs = tmp_path / "world2.log", tmp_path / "world4.log"
    procs = [torchrun(2, tmp_path, init_dir, "1,2", logs[0]), torchrun(4, tmp_path, init_dir, "2", logs[1])]
    try:
        reference = one_rank(init_dir)
    finally:
        codes = wait_all(procs, 220)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    moved = max((reference["weights"][k] - w).abs().max().item() for k, w in _initial(init_dir).items())  # type: ignore[index]
    assert moved > 1e-4  # the step really changed the weights
    for name, (dp, tp) in {"tp1-world2.pt": (2, 1), "tp2-world2.pt": (1, 2), "tp2-world4.pt": (2, 2)}.items():
        got = torch.load(tmp_path / name, weights_only=False)
        assert (got["dp"], got["tp"]) == (dp, tp)
        assert got["tokens"] == reference["tokens"]
        for key in ("loss", "ess", "gap"):
            assert got[key] == pytest.approx(reference[key], abs=1e-5), (name, key)
        weights = reference["weights"]
        assert isinstance(weights, dict) and set(got["weights"]) == set(weights)
        worst = max((got["weights"][k] - w).abs().max().item() for k, w in weights.items())
        assert worst < 1e-5, (name, worst)


def _initial(init_dir: Path) -> dict[str, torch.Tensor]:
    from trainer_client.shards import tensors

    model = build_gpt(MODEL, ParallelConfig())
    load_hf_weights(model, init_dir, MODEL)
    return tensors(model)

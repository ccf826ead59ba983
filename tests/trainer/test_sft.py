"""The SFT phase (on the GRPO policy and optimizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import TINY
from trainer_client.learner import Batching
from trainer_client.model import ModelConfig, OptimConfig, ParallelConfig, build_policy, token_logprobs
from trainer_client.packing import micro_batches
from trainer_client.ranks import Ranks
from trainer_client.sft import SftConfig, load_demonstrations, run_sft


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sft_teaches_the_demonstrated_reply_and_only_it(tmp_path: Path) -> None:
    """After the phase the demonstrated responses are far likelier; prompt tokens are not trained on."""
    path = tmp_path / "demos.jsonl"
    demos = [{"prompt_ids": [1, 2, 3, 4 + i % 3], "response_ids": [40 + i % 3, 50, 60, 258]} for i in range(12)]
    path.write_text("".join(json.dumps(d) + "\n" for d in demos))
    samples = load_demonstrations(path)
    assert [s.prompt_len for s in samples] == [4] * 12 and all(len(s.loss_mask) == 4 for s in samples)
    policy = build_policy(ModelConfig(**TINY, seed=5), ParallelConfig(), OptimConfig(lr=1e-4))
    batch = micro_batches(samples[:3], 64, True, torch.device("cpu"))[0]

    def response_nll() -> float:
        with torch.no_grad():
            lp = token_logprobs(policy.ddp, batch.input_ids, batch.labels, batch.cu_seqlens)
        return float(-(lp * batch.mask).sum() / batch.mask.sum())

    before = response_nll()
    result = run_sft(policy, SftConfig(path=path, steps=20, batch=4, lr=2e-2), Batching(64), Ranks(), show=False)
    assert result.steps == 20 and result.last_loss < result.first_loss
    assert response_nll() < before / 4  # from ~ln(259) per token to a small fraction of it
    assert policy.optimizer.param_groups[0]["lr"] == 2e-2  # the GRPO schedule sets its own at its first step


def test_demonstrations_file_must_not_be_empty(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no demonstrations"):
        load_demonstrations(tmp_path / "empty.jsonl")

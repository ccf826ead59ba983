"""Packing, data-parallel shares, recomputation and the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.conftest import TINY
from trainer_client.batch import Sample
from trainer_client.learner import Batching, Learner, LossConfig
from trainer_client.model import (
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    build_gpt,
    build_policy,
    init_parallel,
    token_logprobs,
)
from trainer_client.packing import dp_share, length, micro_batches, pack

pytestmark = [pytest.mark.trainer]


def sample(n: int, prompt: int = 3, seed: int = 0) -> Sample:
    g = torch.Generator().manual_seed(seed)
    return Sample(key=f"s{seed}", tokens=torch.randint(0, 259, (n + 1,), generator=g), prompt_len=prompt,
                  loss_mask=torch.ones(n + 1 - prompt), engine_logprobs=-torch.rand(n + 1 - prompt, generator=g),
                  advantage=1.0 if seed % 2 else -1.0, reward=0.0, staleness=0)  # fmt: skip


def test_pack_first_fit_decreasing_never_splits_a_sequence() -> None:
    samples = [sample(n, seed=i) for i, n in enumerate([30, 5, 20, 12, 9, 50])]
    rows = pack(samples, budget=32)
    assert sorted(s.key for row in rows for s in row) == sorted(s.key for s in samples)
    assert [sum(length(s) for s in row) for row in rows] == [50, 30, 32, 14]  # 50 alone: longer than the budget


def test_dp_share_balances_tokens_and_every_rank_agrees() -> None:
    samples = [sample(n, seed=i) for i, n in enumerate([40, 35, 30, 10, 8, 5, 3])]
    shares = [dp_share(samples, 2, r) for r in range(2)]
    assert sorted(s.key for share in shares for s in share) == sorted(s.key for s in samples)
    loads = [sum(length(s) for s in share) for share in shares]
    assert abs(loads[0] - loads[1]) <= 5 and shares == [dp_share(samples, 2, r) for r in range(2)]


@pytest.mark.slow
def test_packed_rows_give_the_same_logprobs_as_one_sequence_each() -> None:
    cfg = ModelConfig(**TINY, seed=4)
    init_parallel(ParallelConfig(), cfg.seed)
    model = build_gpt(cfg, ParallelConfig()).eval()
    samples = [sample(n, seed=i) for i, n in enumerate([17, 9, 23, 6])]
    [packed] = micro_batches(samples, budget=64, packed=True, device=torch.device("cpu"))
    assert packed.input_ids.shape == (1, 55) and packed.slots == packed.sequence_tokens == 55
    with torch.no_grad():
        row = token_logprobs(model, packed.input_ids, packed.labels, packed.cu_seqlens)[0]
        at = 0
        for s in sorted(samples, key=length, reverse=True):  # the packing order
            alone = token_logprobs(model, s.tokens[None, :-1], s.tokens[None, 1:])[0]
            assert (row[at : at + length(s)] - alone).abs().max() < 1e-5
            at += length(s)


@pytest.mark.slow
def test_activation_recompute_gives_the_same_step() -> None:
    from megatron.core import parallel_state

    samples = [sample(n, seed=i) for i, n in enumerate([12, 7, 15, 9])]
    results = []
    for recompute in (False, True):
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        policy = build_policy(ModelConfig(**TINY, seed=8), ParallelConfig(recompute_activations=recompute),
                              OptimConfig())  # fmt: skip
        stats = Learner(policy, LossConfig(), batching=Batching(32, packed=True)).step(samples)
        results.append((stats.loss, stats.grad_norm))
    assert results[0] == pytest.approx(results[1], abs=1e-6) and results[0][1] > 0


def test_learning_rate_warm_up_then_cosine() -> None:
    optim = OptimConfig(lr=1e-3, warmup_steps=3, decay="cosine", decay_steps=10, min_lr=1e-4)
    assert [optim.lr_at(s) for s in (1, 2, 3)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4])
    assert optim.lr_at(4) < 1e-3 and optim.lr_at(13) == pytest.approx(1e-4) and optim.lr_at(99) == pytest.approx(1e-4)
    assert OptimConfig(lr=1e-3).lr_at(1) == 1e-3


def test_pipeline_parallel_refused_clearly() -> None:
    with pytest.raises(ValueError, match="pipeline_parallel > 1 is not supported"):
        ParallelConfig(pipeline_parallel=2)

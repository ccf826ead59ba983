"""Packed rows attend per sequence: same logprobs and gradients as padded rows, no sight across sequences."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
import torch

from tests.trainer.conftest import TINY
from tests.trainer.test_packing import sample
from trainer_client.model import ModelConfig, ParallelConfig, build_gpt, init_parallel, token_logprobs
from trainer_client.packing import MicroBatch, length, micro_batches

pytestmark = [pytest.mark.trainer]

CPU = torch.device("cpu")


def tiny_model(seed: int) -> Any:
    cfg = ModelConfig(**TINY, seed=seed)
    init_parallel(ParallelConfig(), cfg.seed)
    torch.manual_seed(seed)
    return build_gpt(cfg, ParallelConfig())


def per_sequence(model: Any, batches: list[MicroBatch]) -> tuple[dict[tuple[int, ...], torch.Tensor], torch.Tensor]:
    """Each sequence's per-token logprobs (keyed by its input ids) and the micro-batches' summed policy loss."""
    out: dict[tuple[int, ...], torch.Tensor] = {}
    loss = torch.zeros(())
    for mb in batches:
        logp = token_logprobs(model, mb.input_ids, mb.labels, mb.cu_seqlens)
        loss = loss - (logp * mb.mask * mb.advantages).sum()
        for b in range(mb.input_ids.shape[0]):
            bounds = mb.cu_seqlens.tolist() if mb.cu_seqlens is not None else [0, int((mb.labels[b] != 0).sum())]
            for start, end in itertools.pairwise(bounds):
                out[tuple(mb.input_ids[b, start:end].tolist())] = logp[b, start:end].detach()
    return out, loss


def gradients(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    return {name: torch.zeros_like(p) if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.slow
def test_packed_and_padded_rows_give_the_same_logprobs_and_gradients() -> None:
    model = tiny_model(seed=11).train()
    # labels avoid token 0 so that padded rows' lengths can be read back from the labels
    samples = [sample(n, seed=i) for i, n in enumerate([23, 9, 17, 30, 6])]
    samples = [dataclasses.replace(s, tokens=s.tokens.clamp(min=1)) for s in samples]
    packed = micro_batches(samples, budget=64, packed=True, device=CPU)
    padded = micro_batches(samples, budget=64, packed=False, device=CPU)
    assert len(packed) == 2 and all(mb.cu_seqlens is not None for mb in packed)
    assert all(mb.cu_seqlens is None for mb in padded)
    assert sum(mb.slots for mb in padded) > sum(mb.slots for mb in packed) == sum(length(s) for s in samples)
    lp_packed, loss_packed = per_sequence(model, packed)
    grads_packed = gradients(model, loss_packed)
    lp_padded, loss_padded = per_sequence(model, padded)
    grads_padded = gradients(model, loss_padded)
    assert lp_packed.keys() == lp_padded.keys() and len(lp_packed) == len(samples)
    assert max(float((lp_packed[k] - lp_padded[k]).abs().max()) for k in lp_packed) < 1e-5
    assert float(loss_packed.detach()) == pytest.approx(float(loss_padded.detach()), abs=1e-4)
    scale = max(float(g.abs().max()) for g in grads_padded.values())
    assert scale > 0
    assert max(float((grads_packed[n] - grads_padded[n]).abs().max()) for n in grads_padded) < 1e-5 * max(scale, 1)


@pytest.mark.slow
def test_sequences_of_a_packed_row_do_not_see_each_other() -> None:
    model = tiny_model(seed=12).eval()
    first, second = sample(20, seed=1), sample(12, seed=2)
    changed = dataclasses.replace(first, tokens=(first.tokens + 7) % 259)
    with torch.no_grad():
        rows = []
        for head in (first, changed):
            [mb] = micro_batches([head, second], budget=64, packed=True, device=CPU)
            assert mb.cu_seqlens is not None and mb.cu_seqlens.tolist() == [0, 20, 32]  # longest first
            rows.append(token_logprobs(model, mb.input_ids, mb.labels, mb.cu_seqlens)[0])
        alone = token_logprobs(model, second.tokens[None, :-1], second.tokens[None, 1:])[0]
    assert float((rows[0][:20] - rows[1][:20]).abs().max()) > 1e-3  # the first sequence did change
    assert float((rows[0][20:] - rows[1][20:]).abs().max()) < 1e-6  # the second one did not notice
    assert float((rows[0][20:] - alone).abs().max()) < 1e-5


@pytest.mark.slow
def test_segment_attention_refuses_what_it_does_not_compute() -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    from trainer_client.attention import SegmentAttention  # in the test: Megatron's import costs every collection

    model = tiny_model(seed=13)
    core = model.decoder.layers[0].self_attention.core_attention
    assert isinstance(core, SegmentAttention)
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="thd"):
        core(q, q[:, :1], q[:, :1], None, packed_seq_params=PackedSeqParams(qkv_format="sbhd"))


def test_transformer_engine_attention_is_refused_where_it_cannot_run() -> None:
    from trainer_client.attention import SegmentAttention, core_attention

    if torch.cuda.is_available():
        pytest.skip("this host may have Transformer Engine")
    assert core_attention("auto") is SegmentAttention and core_attention("sdpa") is SegmentAttention
    with pytest.raises(ValueError, match="transformer_engine"):
        core_attention("te")

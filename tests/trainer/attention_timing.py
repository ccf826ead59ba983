"""Attention alone (forward + backward, one thread) on the rows of ``rollout bench trainer``: which kernel.

    python -m tests.trainer.attention_timing [--json PATH]

The bench's model has 4 query heads, 2 key/value groups, head dim 32; its step's 32 agent-shaped
samples are packed into rows of at most 2,048 tokens (or padded, longest first). Timed, summed over
the step's micro-batches (median of 3 after a warm-up):

- ``packed_local_block_s``: Megatron's unfused local attention (matmul, masked fill, softmax,
  matmul) with the dense ``[L, L]`` block-diagonal mask: what packed rows cost before;
- ``packed_sdpa_block_s``: one SDPA call per row with that block mask;
- ``packed_sdpa_segments_s``: one causal SDPA call per sequence (what :class:`SegmentAttention` does);
- ``packed_sdpa_segments_gqa_s``: the same with SDPA's ``enable_gqa`` instead of repeating key/value heads;
- ``padded_local_s`` / ``padded_sdpa_mask_s`` / ``padded_sdpa_causal_s``: padded micro-batches with
  Megatron's local attention and the padded mask (what padded rows cost before), SDPA with that
  mask, SDPA causal without a mask (what padded rows do now).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer_client.bench import BUDGET, agent_samples
from trainer_client.packing import length, micro_batches, pack

HEADS, GROUPS, DIM = 4, 2, 32
SCALE = DIM**-0.5
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def qkv(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shapes = ((rows, HEADS, width, DIM), (rows, GROUPS, width, DIM), (rows, GROUPS, width, DIM))
    q, k, v = (torch.randn(*shape, requires_grad=True) for shape in shapes)
    return q, k, v


def rep(t: torch.Tensor) -> torch.Tensor:
    return t.repeat_interleave(HEADS // GROUPS, dim=1)


def local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forbidden: torch.Tensor | None) -> torch.Tensor:
    scores = torch.matmul(q, rep(k).transpose(-1, -2)) * SCALE
    assert forbidden is not None
    return torch.matmul(torch.softmax(scores.masked_fill(forbidden, -10000.0), -1), rep(v))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forbidden: torch.Tensor | None) -> torch.Tensor:
    allowed = None if forbidden is None else ~forbidden
    return F.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=allowed, is_causal=allowed is None, scale=SCALE)


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forbidden: torch.Tensor | None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE, enable_gqa=True)


def block_mask(bounds: list[int]) -> torch.Tensor:
    out = torch.ones(bounds[-1], bounds[-1], dtype=torch.bool)
    for a, b in itertools.pairwise(bounds):
        out[a:b, a:b] = torch.triu(torch.ones(b - a, b - a, dtype=torch.bool), diagonal=1)
    return out[None, None]


def packed(attend: Attend, per_segment: bool, rows: list[list[int]]) -> Callable[[], None]:
    def run() -> None:
        for row in rows:
            bounds = [0, *itertools.accumulate(row)]
            q, k, v = qkv(1, bounds[-1])
            if per_segment:
                parts = [attend(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], None) for a, b in itertools.pairwise(bounds)]
                out = torch.cat(parts, dim=2)
            else:
                out = attend(q, k, v, block_mask(bounds))
            out.sum().backward()  # type: ignore[no-untyped-call]

    return run


def padded_mask(lengths: list[int], width: int) -> torch.Tensor:
    """The padded rows' mask before: causal, and the padding after a row's tokens sees itself only."""
    out = torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1).repeat(len(lengths), 1, 1, 1)
    for b, n in enumerate(lengths):
        out[b, 0, n:, :n] = True
    return out


def padded(attend: Attend, masked: bool) -> Callable[[], None]:
    samples = sorted(agent_samples(), key=length, reverse=True)
    batches = micro_batches(samples, BUDGET, False, torch.device("cpu"))
    lengths, at = [], 0  # micro_batches keeps this longest-first order
    for mb in batches:
        lengths.append([length(s) for s in samples[at : at + mb.input_ids.shape[0]]])
        at += mb.input_ids.shape[0]

    def run() -> None:
        for mb, row_lengths in zip(batches, lengths, strict=True):
            q, k, v = qkv(*mb.input_ids.shape)
            forbidden = padded_mask(row_lengths, mb.input_ids.shape[1]) if masked else None
            attend(q, k, v, forbidden).sum().backward()  # type: ignore[no-untyped-call]

    return run


def median_s(run: Callable[[], None], repeats: int = 3) -> float:
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [[length(s) for s in row] for row in pack(agent_samples(), BUDGET)]
    cases = {
        "packed_local_block_s": packed(local, False, rows),
        "packed_sdpa_block_s": packed(sdpa, False, rows),
        "packed_sdpa_segments_s": packed(sdpa, True, rows),
        "packed_sdpa_segments_gqa_s": packed(sdpa_gqa, True, rows),
        "padded_local_s": padded(local, True),
        "padded_sdpa_mask_s": padded(sdpa, True),
        "padded_sdpa_causal_s": padded(sdpa, False),
    }
    figures: dict[str, object] = {name: median_s(run) for name, run in cases.items()}
    figures["packed_rows"] = rows
    for name, value in figures.items():
        print(f"{name:28s} {value:.3f}" if isinstance(value, float) else f"{name:28s} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

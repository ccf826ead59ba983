"""From a step's samples to this rank's micro-batches: data-parallel shares, packing, padding.

- **Data-parallel share** (:func:`dp_share`): samples go, longest first, to the data-parallel rank
  with the fewest tokens so far, so every rank does about the same work; the split is a pure
  function of the sample list, so every rank computes the same one without talking.
- **Packed micro-batches** (``packed=True``): first-fit decreasing of whole sequences into rows of
  at most ``micro_batch_tokens`` tokens; one row per micro-batch, carrying its segment boundaries
  (``cu_seqlens``). The model runs the row in Megatron's ``thd`` packed layout: rotary positions
  restart in every sequence and attention is computed per sequence (see
  :mod:`trainer_client.attention`), so a sequence's logprobs are those it has alone and a row
  costs the sum of its sequences' squared lengths, never the square of the row. No padding at
  all (a sequence longer than the budget gets a row of its own).
- **Padded micro-batches** (``packed=False``): rows padded to the longest of the micro-batch, as
  many rows as fit in ``micro_batch_tokens`` (at least one), plain causal attention; kept for
  comparison (``rollout bench trainer``).

Row layout per sequence: ``input_ids = tokens[:-1]``, ``labels = tokens[1:]``; response token
``j`` is predicted at ``prompt_len - 1 + j`` (see :mod:`trainer_client.batch`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from trainer_client.batch import Sample


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [B, L] int64
    labels: torch.Tensor  # [B, L] int64
    mask: torch.Tensor  # [B, L] float: 1 on generated response tokens
    engine_logprobs: torch.Tensor  # [B, L] float
    advantages: torch.Tensor  # [B, L] float (each sequence's advantage on its positions)
    cu_seqlens: torch.Tensor | None = None  # packed (B == 1): int32 segment boundaries [0, l1, l1 + l2, ...]
    sequence_tokens: int = 0  # positions holding a real token (the rest is padding)

    @property
    def tokens(self) -> int:
        """Generated tokens in the loss."""
        return int(self.mask.sum())

    @property
    def slots(self) -> int:
        """Positions computed, padding included."""
        return int(self.input_ids.numel())


def length(sample: Sample) -> int:
    return len(sample.tokens) - 1


def dp_share(samples: list[Sample], dp_size: int, dp_rank: int) -> list[Sample]:
    """This data-parallel rank's samples (balanced by token count; same answer on every rank)."""
    if dp_size == 1:
        return samples
    load = [0] * dp_size
    owner: dict[int, int] = {}
    for i in sorted(range(len(samples)), key=lambda i: (-length(samples[i]), i)):
        rank = min(range(dp_size), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += length(samples[i])
    return [s for i, s in enumerate(samples) if owner[i] == dp_rank]


def pack(samples: list[Sample], budget: int) -> list[list[Sample]]:
    """First-fit decreasing of sequences into rows of at most ``budget`` tokens."""
    rows: list[list[Sample]] = []
    room: list[int] = []
    for s in sorted(samples, key=length, reverse=True):
        fit = next((i for i, r in enumerate(room) if r >= length(s)), None)
        if fit is None:
            rows.append([s])
            room.append(budget - length(s))
        else:
            rows[fit].append(s)
            room[fit] -= length(s)
    return rows


def micro_batches(samples: list[Sample], budget: int, packed: bool, device: torch.device) -> list[MicroBatch]:
    """This rank's micro-batches, each of at most ``budget`` token slots (bar one over-long sequence)."""
    if packed:
        return [collate([row], device, packed=True) for row in pack(samples, budget)]
    ordered = sorted(samples, key=length, reverse=True)
    out: list[MicroBatch] = []
    i = 0
    while i < len(ordered):
        rows = max(1, budget // max(length(ordered[i]), 1))
        out.append(collate([[s] for s in ordered[i : i + rows]], device))
        i += rows
    return out


def collate(rows: list[list[Sample]], device: torch.device, packed: bool = False) -> MicroBatch:
    """Rows of sequences, right-padded to the longest row: one packed row of segments
    (``cu_seqlens``), or padded rows of one sequence each (plain causal attention: a real token
    never sees the padding after it, and the padding's outputs are masked out of the loss)."""
    if packed and len(rows) != 1:
        raise ValueError("a packed micro-batch is one row")
    width = max(sum(length(s) for s in row) for row in rows)
    shape = (len(rows), width)
    ids, labels = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
    mask, engine, adv = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)
    for b, row in enumerate(rows):
        at = 0
        for s in row:
            n, start, resp = length(s), at + s.prompt_len - 1, len(s.loss_mask)
            ids[b, at : at + n], labels[b, at : at + n] = s.tokens[:-1], s.tokens[1:]
            mask[b, start : start + resp] = s.loss_mask
            engine[b, start : start + resp] = s.engine_logprobs
            adv[b, at : at + n] = s.advantage
            at += n
    real = sum(length(s) for row in rows for s in row)
    bounds = None
    if packed:
        bounds = torch.tensor([0, *itertools.accumulate(length(s) for s in rows[0])], dtype=torch.int32).to(device)
    ids, labels, mask, engine, adv = (t.to(device) for t in (ids, labels, mask, engine, adv))
    return MicroBatch(ids, labels, mask, engine, adv, bounds, sequence_tokens=real)

"""From GRPO groups to samples: one per trajectory, with its advantage, aligned for next-token logprobs.

Layout: ``input_ids = tokens[:-1]`` and ``labels = tokens[1:]`` with ``tokens = prompt +
response``. Response token ``j`` is predicted at position ``P - 1 + j`` (``P`` = prompt length),
so the trajectory's ``loss_mask`` and engine ``response_logprobs`` are shifted there. Micro-batches
(packed or padded) are built in :mod:`trainer_client.packing`.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass

import torch

from services.protocol.trajectory import Segment
from trainer_client.groups import Group
from trainer_client.grpo import group_advantages


@dataclass(frozen=True)
class Sample:
    key: str
    tokens: torch.Tensor  # int64 [P + R]
    prompt_len: int
    loss_mask: torch.Tensor  # float [R]
    engine_logprobs: torch.Tensor  # float [R]
    advantage: float
    reward: float
    staleness: int


def as_tensor(values: array, dtype: torch.dtype) -> torch.Tensor:  # type: ignore[type-arg]
    """Zero-copy view of a contract token array (then cast to ``dtype``)."""
    if len(values) == 0:
        return torch.zeros(0, dtype=dtype)
    source = {"i": torch.int32, "f": torch.float32, "B": torch.uint8}[values.typecode]
    return torch.frombuffer(values, dtype=source).to(dtype)


def samples_from_groups(groups: list[Group], version: int, normalize_std: bool, max_len: int) -> list[Sample]:
    """One sample per token-exact segment of each valid member (one for most agents; more when a
    gateway agent rewrote its history); advantages normalised within each group, per trajectory."""
    samples = []
    for group in groups:
        advantages = group_advantages(group.rewards(), normalize_std=normalize_std)
        for member, adv in zip(group.members, advantages.tolist(), strict=True):
            traj = member.trajectory
            for index, segment in enumerate(traj.all_segments()):
                key = traj.attempt_key if index == 0 else f"{traj.attempt_key}#{index}"
                samples.append(_sample(key, segment, max_len, adv, traj.trainable_reward, version - member.version))
    return samples


def _sample(key: str, segment: Segment, max_len: int, advantage: float, reward: float, staleness: int) -> Sample:
    prompt = as_tensor(segment.prompt_ids, torch.int64)
    response = as_tensor(segment.response_ids, torch.int64)
    keep = max(0, min(len(response), max_len + 1 - len(prompt)))
    return Sample(
        key=key,
        tokens=torch.cat([prompt, response[:keep]]),
        prompt_len=len(prompt),
        loss_mask=as_tensor(segment.loss_mask, torch.float32)[:keep],
        engine_logprobs=as_tensor(segment.response_logprobs, torch.float32)[:keep],
        advantage=advantage,
        reward=reward,
        staleness=staleness,
    )


def staleness_histogram(samples: list[Sample]) -> dict[str, int]:
    counts = Counter(s.staleness for s in samples)
    return {str(k): counts[k] for k in sorted(counts)}

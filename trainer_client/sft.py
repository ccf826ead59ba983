"""Supervised fine-tuning on demonstrations, on the same Megatron policy, optimizer and export path as GRPO.

Demonstrations are token ids, exactly as the rollout worker renders an episode (system prompt,
task message, chat template) followed by the demonstrated reply and its end-of-turn token: the
policy learns the very sequences it will later generate. File format: JSONL, one
``{"prompt_ids": [...], "response_ids": [...]}`` per line.

The loss is the mean negative log-likelihood of the response tokens of a batch (gradients summed
over data-parallel ranks by Megatron DDP, like the GRPO loss). Every optimizer step of the phase
is a step of the run's lineage: the weights after it are labelled ``"<steps>-e<epoch>"`` and
rollouts generated before it are stale.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from trainer_client.batch import Sample
from trainer_client.cpu_shims import megatron_on_cpu
from trainer_client.learner import Batching
from trainer_client.model import Policy, device, token_logprobs
from trainer_client.packing import dp_share, micro_batches
from trainer_client.ranks import Ranks

logger = logging.getLogger(__name__)


class SftConfig(BaseModel):
    """``ROLLOUT_TRAIN_SFT__*``: the phase runs once, before GRPO, on a fresh run (step 0) with a ``path``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path | None = None  # demonstrations (JSONL of token ids); None: no SFT phase
    steps: int = Field(200, ge=1)  # optimizer steps
    batch: int = Field(16, ge=1)  # demonstrations per step
    lr: float = Field(3e-3, gt=0)  # constant; the GRPO schedule takes over afterwards
    seed: int = 0  # order of the demonstrations


@dataclass(frozen=True)
class SftResult:
    steps: int
    first_loss: float
    last_loss: float  # mean over the last 10 steps
    seconds: float


def load_demonstrations(path: Path) -> list[Sample]:
    """Demonstrations as samples (loss on every response token)."""
    samples = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        doc = json.loads(line)
        prompt, response = list(doc["prompt_ids"]), list(doc["response_ids"])
        samples.append(Sample(
            key=f"demo-{i}", tokens=torch.tensor(prompt + response, dtype=torch.int64), prompt_len=len(prompt),
            loss_mask=torch.ones(len(response)), engine_logprobs=torch.zeros(len(response)),
            advantage=1.0, reward=1.0, staleness=0,
        ))  # fmt: skip
    if not samples:
        raise ValueError(f"{path}: no demonstrations")
    return samples


def run_sft(policy: Policy, config: SftConfig, batching: Batching, ranks: Ranks, show: bool = True) -> SftResult:
    """``config.steps`` optimizer steps over shuffled demonstrations (every rank, same order)."""
    assert config.path is not None
    demos = load_demonstrations(config.path)
    rng = random.Random(config.seed)
    order: list[Sample] = []
    for group in policy.optimizer.param_groups:
        group["lr"] = config.lr
    started = time.perf_counter()
    losses: list[float] = []
    bar = tqdm(range(config.steps), desc="SFT", unit="step", disable=not (show and ranks.leader))
    for _ in bar:
        if len(order) < config.batch:
            order.extend(rng.sample(demos, len(demos)))
        batch, order = order[: config.batch], order[config.batch :]
        losses.append(_step(policy, batch, batching, ranks))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    result = SftResult(config.steps, losses[0], sum(losses[-10:]) / len(losses[-10:]), time.perf_counter() - started)
    logger.info("SFT: %d steps on %d demonstrations, loss %.3f -> %.3f (%.1fs)", result.steps, len(demos),
                result.first_loss, result.last_loss, result.seconds)  # fmt: skip
    return result


def _step(policy: Policy, batch: list[Sample], batching: Batching, ranks: Ranks) -> float:
    """One optimizer step on this rank's share; returns the batch's mean loss per response token."""
    tokens = int(sum(float(s.loss_mask.sum()) for s in batch))
    mine = dp_share(batch, ranks.dp_size, ranks.dp_rank)
    ddp, optimizer = policy.ddp, policy.optimizer
    ddp.train()
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    total = 0.0
    for mb in micro_batches(mine, batching.micro_batch_tokens, batching.packed, device()):
        logp = token_logprobs(ddp, mb.input_ids, mb.labels, mb.cu_seqlens)
        loss = -(logp * mb.mask).sum() / tokens
        loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    with megatron_on_cpu():
        ddp.finish_grad_sync()
        optimizer.step()
    return ranks.dp_sum([total])[0]

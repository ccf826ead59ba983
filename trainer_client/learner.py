"""One GRPO training step on the Megatron policy: logprob recompute, then the actor update.

Every rank holds the step's whole sample list; each data-parallel rank trains on its share
(:func:`trainer_client.packing.dp_share`). The loss of a mini-batch is divided by the generated
tokens of the *whole* mini-batch (every rank can count them), and Megatron DDP sums the gradients
over data-parallel ranks (``calculate_per_token_loss``): the update equals one rank's on the same
batch. Figures (loss, gap, ESS, ...) are summed over data-parallel ranks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from trainer_client import grpo
from trainer_client.batch import Sample
from trainer_client.cpu_shims import megatron_on_cpu
from trainer_client.model import OptimConfig, Policy, device, token_logprobs
from trainer_client.packing import MicroBatch, dp_share, micro_batches
from trainer_client.ranks import Ranks


class LossConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)  # DAPO's clip-higher
    tis_cap: float = Field(2.0, gt=0)  # truncated importance sampling cap
    kl_coef: float = Field(0.0, ge=0)  # KL to the initial policy (k3); 0 = off, no reference model kept
    normalize_std: bool = True
    mini_batches: int = Field(1, ge=1)  # optimizer steps per training step


@dataclass(frozen=True)
class StepStats:
    """One training step, summed over every data-parallel rank (identical on every rank)."""

    loss: float
    grad_norm: float
    clip_fraction: float
    logprob_gap: float  # mean |trainer - engine| logprob per generated token (before the update)
    ess: float  # normalised ESS of the untruncated importance weights
    tis_mean: float  # mean truncated weight
    kl: float
    tokens: int  # generated tokens in the loss
    slots: int  # token positions computed (padding included)
    sequence_tokens: int  # tokens of the sequences themselves (prompt + response - 1)
    lr: float
    recompute_s: float  # this rank's
    update_s: float  # this rank's


@dataclass(frozen=True)
class Batching:
    micro_batch_tokens: int = 8192  # token slots per micro-batch
    packed: bool = True  # pack sequences into rows (no padding) or pad rows to the longest


SUMS = ("tokens", "gap", "w", "w2", "tis", "loss", "clipped", "kl", "slots", "sequence_tokens")


class Learner:
    def __init__(
        self,
        policy: Policy,
        loss: LossConfig,
        reference: object | None = None,
        ranks: Ranks | None = None,
        batching: Batching | None = None,
        optim: OptimConfig | None = None,
    ) -> None:
        self.policy = policy
        self.loss = loss
        self.reference = reference  # a frozen GPTModel when kl_coef > 0
        self.ranks = ranks or Ranks()
        self.batching = batching or Batching()
        self.optim = optim

    def plan(self, samples: list[Sample]) -> list[tuple[list[MicroBatch], int]]:
        """Per mini-batch: this rank's micro-batches and the mini-batch's generated-token count (all ranks)."""
        r, b = self.ranks, self.batching
        out = []
        for chunk in _split(samples, self.loss.mini_batches):
            mine = dp_share(chunk, r.dp_size, r.dp_rank)
            tokens = int(sum(float(s.loss_mask.sum()) for s in chunk))
            out.append((micro_batches(mine, b.micro_batch_tokens, b.packed, device()), tokens))
        return out

    @torch.no_grad()
    def logprobs(self, model: Any, batches: list[MicroBatch]) -> list[torch.Tensor]:
        model.eval()
        return [token_logprobs(model, mb.input_ids, mb.labels, mb.cu_seqlens) for mb in batches]

    def step(self, samples: list[Sample], step: int = 1) -> StepStats:
        """Recompute the 'old' logprobs, then one optimizer step per mini-batch; ``step`` sets the learning rate."""
        t0 = time.perf_counter()
        plan = self.plan(samples)
        old = [self.logprobs(self.policy.ddp, batches) for batches, _ in plan]
        use_ref = self.reference is not None and self.loss.kl_coef > 0
        ref = [self.logprobs(self.reference, batches) if use_ref else None for batches, _ in plan]
        t1 = time.perf_counter()
        lr = self._set_lr(step)
        sums = dict.fromkeys(SUMS, 0.0)
        grad_norm = 0.0
        for (batches, tokens), old_lp, ref_lp in zip(plan, old, ref, strict=True):
            self._observe(batches, old_lp, sums)
            grad_norm += self._mini_batch(batches, old_lp, ref_lp, tokens, sums)
        t2 = time.perf_counter()
        return self._stats(sums, grad_norm / len(plan), len(plan), lr, t1 - t0, t2 - t1)

    def _set_lr(self, step: int) -> float:
        if self.optim is None:
            return float(self.policy.optimizer.param_groups[0]["lr"])
        lr = self.optim.lr_at(step)
        for group in self.policy.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _observe(self, batches: list[MicroBatch], old: list[torch.Tensor], sums: dict[str, float]) -> None:
        """Per-token figures before the update: logprob gap, importance weights, truncated weights."""
        for mb, old_lp in zip(batches, old, strict=True):
            ratio = grpo.importance_ratios(old_lp, mb.engine_logprobs)
            tis = grpo.truncated_is_weights(old_lp, mb.engine_logprobs, self.loss.tis_cap)
            sums["tokens"] += float(mb.mask.sum())
            sums["gap"] += float(((old_lp - mb.engine_logprobs).abs() * mb.mask).sum())
            sums["w"] += float((ratio * mb.mask).sum())
            sums["w2"] += float((ratio**2 * mb.mask).sum())
            sums["tis"] += float((tis * mb.mask).sum())
            sums["slots"] += mb.slots
            sums["sequence_tokens"] += mb.sequence_tokens

    def _stats(
        self, local: dict[str, float], grad_norm: float, steps: int, lr: float, recompute_s: float, update_s: float
    ) -> StepStats:
        s = dict(zip(SUMS, self.ranks.dp_sum([local[k] for k in SUMS]), strict=True))
        n = s["tokens"]
        return StepStats(
            loss=s["loss"] / steps,
            grad_norm=grad_norm,
            clip_fraction=s["clipped"] / max(n, 1),
            logprob_gap=s["gap"] / n if n else 0.0,
            ess=s["w"] ** 2 / (n * s["w2"]) if n and s["w2"] else 1.0,
            tis_mean=s["tis"] / max(n, 1),
            kl=s["kl"] / max(n, 1),
            tokens=int(n),
            slots=int(s["slots"]),
            sequence_tokens=int(s["sequence_tokens"]),
            lr=lr,
            recompute_s=recompute_s,
            update_s=update_s,
        )

    def _mini_batch(
        self,
        batches: list[MicroBatch],
        old: list[torch.Tensor],
        ref: list[torch.Tensor] | None,
        token_count: int,
        sums: dict[str, float],
    ) -> float:
        """Forward/backward over this rank's micro-batches, gradient sum over ranks, one optimizer step."""
        ddp, optimizer = self.policy.ddp, self.policy.optimizer
        ddp.train()
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        for i, (mb, old_lp) in enumerate(zip(batches, old, strict=True)):
            logp = token_logprobs(ddp, mb.input_ids, mb.labels, mb.cu_seqlens)
            out = grpo.clipped_policy_loss(
                logp, old_lp, mb.advantages, mb.mask,
                grpo.truncated_is_weights(old_lp, mb.engine_logprobs, self.loss.tis_cap), token_count,
                self.loss.clip_low, self.loss.clip_high, ref[i] if ref else None, self.loss.kl_coef,
            )  # fmt: skip
            out.loss.backward()  # type: ignore[no-untyped-call]
            sums["loss"] += float(out.loss.detach())
            sums["clipped"] += out.clipped_tokens
            sums["kl"] += out.kl_sum
        with megatron_on_cpu():
            ddp.finish_grad_sync()
            _, grad_norm, _ = optimizer.step()
        return float(grad_norm or 0.0)


def _split(items: list[Sample], parts: int) -> list[list[Sample]]:
    parts = max(1, min(parts, len(items)))
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)]

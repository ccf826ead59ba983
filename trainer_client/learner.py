"""One GRPO optimizer step on the Megatron policy: logprob recompute, then the actor update."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from trainer_client import grpo
from trainer_client.batch import MicroBatch
from trainer_client.cpu_shims import megatron_on_cpu
from trainer_client.model import Policy, token_logprobs


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
    loss: float
    grad_norm: float
    clip_fraction: float
    logprob_gap: float  # mean |trainer - engine| logprob per generated token (before the update)
    ess: float  # normalised ESS of the untruncated importance weights
    tis_mean: float  # mean truncated weight
    kl: float
    tokens: int
    recompute_s: float
    update_s: float


class Learner:
    def __init__(self, policy: Policy, loss: LossConfig, reference: object | None = None) -> None:
        self.policy = policy
        self.loss = loss
        self.reference = reference  # a frozen GPTModel when kl_coef > 0

    @torch.no_grad()
    def recompute(self, batches: list[MicroBatch]) -> list[torch.Tensor]:
        """Trainer logprobs of the current weights (the PPO 'old' policy), no gradient."""
        self.policy.ddp.eval()
        return [token_logprobs(self.policy.ddp, mb.input_ids, mb.labels) for mb in batches]

    @torch.no_grad()
    def reference_logprobs(self, batches: list[MicroBatch]) -> list[torch.Tensor] | None:
        if self.reference is None or self.loss.kl_coef == 0:
            return None
        return [token_logprobs(self.reference, mb.input_ids, mb.labels) for mb in batches]

    def step(self, batches: list[MicroBatch]) -> StepStats:
        t0 = time.perf_counter()
        old = self.recompute(batches)
        ref = self.reference_logprobs(batches)
        t1 = time.perf_counter()
        mask = torch.cat([mb.mask.flatten() for mb in batches])
        old_flat = torch.cat([o.flatten() for o in old])
        engine_flat = torch.cat([mb.engine_logprobs.flatten() for mb in batches])
        ratios = grpo.importance_ratios(old_flat, engine_flat)
        tis = grpo.truncated_is_weights(old_flat, engine_flat, self.loss.tis_cap)
        totals = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "grad_norm": 0.0}
        chunks = _split(list(range(len(batches))), self.loss.mini_batches)
        for chunk in chunks:
            self._mini_batch([batches[i] for i in chunk], [old[i] for i in chunk], ref, chunk, totals)
        tokens = int(mask.sum())
        return StepStats(
            loss=totals["loss"] / len(chunks),
            grad_norm=totals["grad_norm"] / len(chunks),
            clip_fraction=totals["clipped"] / max(tokens, 1),
            logprob_gap=grpo.mean_abs_gap(old_flat, engine_flat, mask),
            ess=grpo.effective_sample_size(ratios, mask),
            tis_mean=float((tis * mask).sum() / max(tokens, 1)),
            kl=totals["kl"] / max(tokens, 1),
            tokens=tokens,
            recompute_s=t1 - t0,
            update_s=time.perf_counter() - t1,
        )

    def _mini_batch(
        self,
        batches: list[MicroBatch],
        old: list[torch.Tensor],
        ref: list[torch.Tensor] | None,
        index: list[int],
        totals: dict[str, float],
    ) -> None:
        ddp, optimizer = self.policy.ddp, self.policy.optimizer
        ddp.train()
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        token_count = sum(mb.tokens for mb in batches)
        for mb, old_lp, i in zip(batches, old, index, strict=True):
            logp = token_logprobs(ddp, mb.input_ids, mb.labels)
            out = grpo.clipped_policy_loss(
                logp, old_lp, mb.advantages, mb.mask,
                grpo.truncated_is_weights(old_lp, mb.engine_logprobs, self.loss.tis_cap), token_count,
                self.loss.clip_low, self.loss.clip_high, ref[i] if ref else None, self.loss.kl_coef,
            )  # fmt: skip
            out.loss.backward()  # type: ignore[no-untyped-call]
            totals["loss"] += float(out.loss.detach())
            totals["clipped"] += out.clipped_tokens
            totals["kl"] += out.kl_sum
        with megatron_on_cpu():
            ddp.finish_grad_sync()
            _, grad_norm, _ = optimizer.step()
        totals["grad_norm"] += float(grad_norm or 0.0)


def _split(items: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(items)))
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)]

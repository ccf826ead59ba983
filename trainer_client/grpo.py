"""GRPO maths as plain functions over tensors.

Conventions: per-token tensors are [B, T] and aligned with the loss mask (1 = a token the policy
generated, 0 = prompt, tool output or padding). Losses are token-level: summed over the masked
tokens and divided by the number of masked tokens of the whole step (``token_count``), so
micro-batches add up to the same loss as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Rewards of one group minus their mean, divided by their (population) std when ``normalize_std``."""
    centred = rewards - rewards.mean()
    if not normalize_std:
        return centred
    return centred / (rewards.std(unbiased=False) + eps)


def is_zero_variance(rewards: torch.Tensor, tol: float = 1e-8) -> bool:
    """Every member got the same reward: the group carries no learning signal."""
    return bool((rewards.max() - rewards.min()).abs() <= tol)


def truncated_is_weights(trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: min(pi_trainer / pi_engine, cap) per token, no gradient."""
    return torch.exp(trainer_logprobs - engine_logprobs).clamp(max=cap).detach()


def importance_ratios(trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor) -> torch.Tensor:
    """Untruncated pi_trainer / pi_engine per token (for the ESS)."""
    return torch.exp(trainer_logprobs - engine_logprobs).detach()


@dataclass(frozen=True)
class PolicyLoss:
    loss: torch.Tensor  # scalar: summed over masked tokens / token_count
    clipped_tokens: float  # masked tokens whose clipped branch was taken
    kl_sum: float  # summed KL estimate over masked tokens (0 when off)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor,
    token_count: int,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> PolicyLoss:
    """Token-level PPO-clip loss, reweighted by truncated IS weights, plus an optional k3 KL term.

    ``advantages`` broadcasts to [B, T] (one value per sequence, [B, 1], is typical).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -is_weights * torch.minimum(unclipped, clipped)
    took_clip = (clipped < unclipped) & (mask > 0)
    kl_sum = 0.0
    if ref_logprobs is not None and kl_coef > 0:
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    loss = (per_token * mask).sum() / max(token_count, 1)
    return PolicyLoss(loss=loss, clipped_tokens=float(took_clip.sum()), kl_sum=kl_sum)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """Normalised ESS of the masked weights: (sum w)^2 / (n * sum w^2), in (0, 1]; 1 = on-policy."""
    w = weights[mask > 0]
    if w.numel() == 0:
        return 1.0
    return float(w.sum() ** 2 / (w.numel() * (w**2).sum()))


def mean_abs_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |a - b| over masked tokens (trainer vs engine logprob gap)."""
    n = float(mask.sum())
    return float(((a - b).abs() * mask).sum() / n) if n else 0.0

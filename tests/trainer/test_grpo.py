"""GRPO maths against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_client import grpo

pytestmark = [pytest.mark.trainer]


def test_group_advantages_with_std() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +1, -1, -1, +1
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), normalize_std=True, eps=0.0)
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]


def test_group_advantages_without_std() -> None:
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), normalize_std=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_zero_variance() -> None:
    assert grpo.is_zero_variance(torch.tensor([1.0, 1.0, 1.0]))
    assert not grpo.is_zero_variance(torch.tensor([1.0, 0.0, 1.0]))
    assert grpo.group_advantages(torch.tensor([0.5, 0.5])).tolist() == [0.0, 0.0]


def test_truncated_is_weights_cap() -> None:
    trainer = torch.tensor([math.log(0.5), math.log(0.9)])
    engine = torch.tensor([math.log(0.25), math.log(0.9)])
    w = grpo.truncated_is_weights(trainer, engine, cap=1.5)
    # ratios 2.0 (capped to 1.5) and 1.0
    assert w.tolist() == pytest.approx([1.5, 1.0])
    assert not w.requires_grad


def test_clipped_loss_on_policy_equals_minus_mean_advantage() -> None:
    # ratio 1 everywhere, weights 1: loss = -sum(A * mask) / n
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[2.0], [-1.0]])
    out = grpo.clipped_policy_loss(logp, logp.detach(), adv, mask, torch.ones(2, 3), token_count=3)
    assert out.loss.item() == pytest.approx(-(2 + 2 - 1) / 3)
    assert out.clipped_tokens == 0
    out.loss.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    # d/dlogp of -ratio*A/n at ratio 1 is -A/n on masked tokens, 0 elsewhere
    assert logp.grad.flatten().tolist() == pytest.approx([-2 / 3, -2 / 3, 0.0, 1 / 3, 0.0, 0.0])


def test_clipping_hand_values() -> None:
    # token 1: ratio 1.5, A=+1 -> clipped to 1.2, takes clip branch; token 2: ratio 0.5, A=+1 -> unclipped 0.5
    # token 3: ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 (clip); token 4: ratio 1.5, A=-1 -> -1.5 (no clip)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    out = grpo.clipped_policy_loss(logp, old, adv, mask, torch.ones(1, 4), token_count=4)
    assert out.loss.item() == pytest.approx(-(1.2 + 0.5 - 0.8 - 1.5) / 4)
    assert out.clipped_tokens == 2


def test_is_weights_scale_the_loss() -> None:
    logp = torch.zeros(1, 2)
    out = grpo.clipped_policy_loss(
        logp, logp, torch.tensor([[1.0]]), torch.ones(1, 2), torch.tensor([[0.5, 2.0]]), token_count=2
    )
    assert out.loss.item() == pytest.approx(-(0.5 + 2.0) / 2)


def test_kl_k3_hand_value_and_term() -> None:
    logp = torch.tensor([[0.0, math.log(0.5)]])
    ref = torch.tensor([[0.0, 0.0]])
    kl = grpo.kl_k3(logp, ref)
    # delta = ref - logp = [0, ln 2]: exp(d) - d - 1 = [0, 2 - ln2 - 1]
    assert kl.flatten().tolist() == pytest.approx([0.0, 1 - math.log(2)])
    out = grpo.clipped_policy_loss(
        logp, logp, torch.zeros(1, 1), torch.ones(1, 2), torch.ones(1, 2), token_count=2, ref_logprobs=ref, kl_coef=0.1
    )
    assert out.loss.item() == pytest.approx(0.1 * (1 - math.log(2)) / 2)
    assert out.kl_sum == pytest.approx(1 - math.log(2))


def test_effective_sample_size() -> None:
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert grpo.effective_sample_size(torch.tensor([1.0, 1.0, 1.0, 9.0]), mask) == pytest.approx(1.0)
    # w = 1, 2, 3: (6)^2 / (3 * 14) = 36/42
    assert grpo.effective_sample_size(torch.tensor([1.0, 2.0, 3.0, 9.0]), mask) == pytest.approx(36 / 42)


def test_mean_abs_gap() -> None:
    a = torch.tensor([[0.0, -1.0, -2.0]])
    b = torch.tensor([[0.1, -1.3, 5.0]])
    assert grpo.mean_abs_gap(a, b, torch.tensor([[1.0, 1.0, 0.0]])) == pytest.approx(0.2)

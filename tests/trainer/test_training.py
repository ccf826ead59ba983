"""A tiny Megatron GPTModel trained on CPU from trajectories read out of a real Redis stream."""

from __future__ import annotations

import pytest
import redis
import torch

from rollout_client.stream import TrajectoryConsumer
from services.protocol import keys
from services.protocol.trajectory import Trajectory, logprobs, to_stream_fields
from tests.trainer.conftest import TINY
from tests.trainer.factories import make_trajectory
from trainer_client.batch import samples_from_groups
from trainer_client.groups import GroupAssembler
from trainer_client.learner import Batching, Learner, LossConfig
from trainer_client.model import ModelConfig, OptimConfig, ParallelConfig, Policy, build_policy, token_logprobs

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def own_logprobs(policy: Policy, traj: Trajectory) -> list[float]:
    """The policy's logprob of each response token, computed on the unpadded sequence."""
    tokens = torch.tensor([*traj.prompt_ids, *traj.response_ids]).unsqueeze(0)
    with torch.no_grad():
        lp = token_logprobs(policy.ddp, tokens[:, :-1], tokens[:, 1:])[0]
    start = len(traj.prompt_ids) - 1
    return lp[start : start + len(traj.response_ids)].tolist()


def on_policy(policy: Policy, traj: Trajectory) -> Trajectory:
    """Engine logprobs equal to the trainer's own (0 on tool tokens): a perfectly synced engine."""
    lp = own_logprobs(policy, traj)
    traj.response_logprobs = logprobs(v if m else 0.0 for v, m in zip(lp, traj.loss_mask, strict=True))
    return traj


def test_train_from_stream_loss_and_logprob_bookkeeping(redis_client: redis.Redis) -> None:
    policy = build_policy(ModelConfig(**TINY, seed=7), ParallelConfig(), OptimConfig(lr=3e-3))
    stream = keys.trajectory_stream("job1")
    trajs = [make_trajectory(f"g{g}", i, reward=float(i % 2), prompt_len=5 + i, gen_len=3 + i, seed=10 * g + i)
             for g in range(2) for i in range(4)]  # fmt: skip
    for traj in trajs:
        redis_client.xadd(stream, to_stream_fields(on_policy(policy, traj)))  # type: ignore[arg-type]

    consumer = TrajectoryConsumer(redis_client, "job1")
    consumer.ensure_group()
    assembler = GroupAssembler(min_valid=2, max_staleness=1)
    for entry in consumer.read(count=100, block_ms=100):
        assert entry.trajectory is not None
        assembler.add(entry.entry_id, entry.trajectory, version=0)
    groups = assembler.take(2, version=0)
    samples = samples_from_groups(groups, version=0, normalize_std=True, max_len=128)
    # padded rows of uneven lengths on purpose (three rows of at most 22 positions per micro-batch)
    learner = Learner(policy, LossConfig(clip_low=0.2, clip_high=0.2, tis_cap=2.0), batching=Batching(66, packed=False))

    stats = learner.step(samples)
    # bookkeeping: the engine logprobs sit exactly where the trainer predicts the same tokens
    assert stats.logprob_gap < 1e-5 and stats.ess == pytest.approx(1.0) and stats.tis_mean == pytest.approx(1.0)
    masked = [sum(t.loss_mask) for t in trajs]
    assert stats.tokens == sum(masked)
    # on-policy first step: ratio 1, weight 1, so loss = -sum_i A_i * n_i / N (A = +-1 within each group)
    expected = -sum((1.0 if t.reward else -1.0) * n for t, n in zip(trajs, masked, strict=True)) / sum(masked)
    assert stats.loss == pytest.approx(expected, abs=1e-4)
    assert stats.clip_fraction == 0.0 and stats.grad_norm > 0

    before = {t.trajectory_id: sum(own_logprobs(policy, t)) for t in trajs}
    assert 0 < 1 - stats.sequence_tokens / stats.slots < 0.5  # padding was computed
    for _ in range(3):
        stats = learner.step(samples)
    after = {t.trajectory_id: sum(own_logprobs(policy, t)) for t in trajs}
    # learning: rewarded responses became likelier, unrewarded ones less likely
    for t in trajs:
        moved = after[t.trajectory_id] - before[t.trajectory_id]
        assert (moved > 0) == (t.trainable_reward > 0), (t.trajectory_id, moved)
    assert stats.logprob_gap > 0 and stats.ess < 1.0  # the engine's logprobs are now stale
    assert stats.clip_fraction == 0.0  # one optimizer step per batch: the recomputed 'old' policy is the current one
    assert [d.fate for d in assembler.drain_decided()] == ["used"] * 8
    assert consumer.ack(e for e in [consumer.last_entry_id]) == 1


def test_kl_term_and_several_mini_batches(redis_client: redis.Redis) -> None:
    """With a frozen reference, KL starts at 0 and grows once the policy moves; two optimizer steps per batch."""
    from trainer_client.model import build_gpt

    policy = build_policy(ModelConfig(**TINY, seed=11), ParallelConfig(), OptimConfig(lr=1e-2))
    reference = build_gpt(policy.config, ParallelConfig())
    reference.load_state_dict(policy.module.state_dict())
    trajs = [on_policy(policy, make_trajectory("g", i, reward=float(i % 2), seed=i)) for i in range(4)]
    assembler = GroupAssembler(min_valid=2, max_staleness=1)
    for i, traj in enumerate(trajs):
        assembler.add(f"{i}-0", traj, version=0)
    samples = samples_from_groups(assembler.take(1, version=0), version=0, normalize_std=True, max_len=128)
    packed = Batching(micro_batch_tokens=40, packed=True)
    first = Learner(policy, LossConfig(kl_coef=0.1), reference=reference, batching=packed).step(samples)
    assert first.kl == pytest.approx(0.0, abs=1e-6)  # policy == reference during the only forward
    assert first.slots == first.sequence_tokens  # packed: no padding
    second = Learner(policy, LossConfig(kl_coef=0.1, mini_batches=2), reference=reference, batching=packed).step(
        samples
    )
    assert second.kl > 1e-6 and second.grad_norm > 0

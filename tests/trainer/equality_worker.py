"""One rank of the equality check: the same batch, the same initial weights, one training step.

Run by ``test_equality.py`` under ``torchrun`` (gloo on CPU)::

    torchrun --nproc-per-node N -m tests.trainer.equality_worker OUT INIT_DIR TP[,TP...]

For each tensor-parallel size listed (the rest of the world is data parallel) it builds the
policy, loads ``INIT_DIR`` (each rank its slice), takes the step's samples from rank 0 (the
trainer's broadcast), trains one step through :class:`trainer_client.learner.Learner` (data-
parallel shares, packed micro-batches) and has rank 0 save the loss and the gathered weights to
``OUT/tp<TP>-world<N>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from tests.trainer.conftest import TINY
from tests.trainer.factories import make_trajectory
from trainer_client.batch import Sample, samples_from_groups
from trainer_client.groups import GroupAssembler
from trainer_client.hf_import import load_hf_weights
from trainer_client.learner import Batching, Learner, LossConfig
from trainer_client.model import ModelConfig, OptimConfig, ParallelConfig, build_policy
from trainer_client.ranks import Ranks
from trainer_client.shards import full_state_dict

MODEL = ModelConfig(**{**TINY, "vocab_size": 260}, family="qwen2", seed=3)  # biases too; vocab splits over 2
OPTIM = OptimConfig(lr=1e-3, warmup_steps=1)
BATCHING = Batching(micro_batch_tokens=48, packed=True)


def step_samples() -> list[Sample]:
    """Two groups of four uneven trajectories (engine logprobs off-policy, so TIS and the ESS matter)."""
    assembler = GroupAssembler(min_valid=2, max_staleness=1)
    for g in range(2):
        for i in range(4):
            traj = make_trajectory(f"g{g}", i, reward=float((i + g) % 2), prompt_len=4 + 3 * i, gen_len=2 + i,
                                   turns=1 + g, seed=10 * g + i)  # fmt: skip
            assembler.add(f"{g}-{i}", traj, version=0)
    return samples_from_groups(assembler.take(2, version=0), version=0, normalize_std=True, max_len=128)


def train_once(tp: int, init_dir: Path) -> tuple[Ranks, dict[str, Any]]:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    policy = build_policy(MODEL, ParallelConfig(tensor_parallel=tp), OPTIM)
    load_hf_weights(policy.module, init_dir, MODEL)
    ranks = Ranks.current()
    samples = ranks.broadcast(step_samples() if ranks.leader else None)
    stats = Learner(policy, LossConfig(), ranks=ranks, batching=BATCHING, optim=OPTIM).step(samples, step=1)
    weights = full_state_dict(policy.module)
    return ranks, {"loss": stats.loss, "tokens": stats.tokens, "ess": stats.ess, "gap": stats.logprob_gap,
                   "weights": weights, "dp": ranks.dp_size, "tp": ranks.tp_size}  # fmt: skip


def main(out: Path, init_dir: Path, sizes: list[int]) -> None:
    for tp in sizes:
        ranks, result = train_once(tp, init_dir)
        if ranks.leader:
            torch.save(result, out / f"tp{tp}-world{ranks.world}.pt")
        ranks.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), [int(v) for v in sys.argv[3].split(",")])

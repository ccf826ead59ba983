"""Trainer step speed on CPU: packed vs padded micro-batches, and two data-parallel ranks vs one.

A fixed small model (Llama-style, 4 layers, hidden 128) trains on one batch of agent-shaped
samples: 4 groups x 8, each a prompt of 64-256 tokens then a response whose length is drawn
from a long-tailed distribution (half of them short, a quarter near the 1,024-token cap, as in
the field report where most attempts hit a cap and the rest differ 2.5x). Every run uses one
intra-op thread per rank, so that "two ranks" means two cores' worth of work.

- ``tokens_per_s_packed`` / ``tokens_per_s_padded``: sequence tokens per second of a training step
  (recompute + update) with packed rows vs rows padded to the longest of their micro-batch, the
  same token budget per micro-batch. Packed rows run in Megatron's ``thd`` layout with attention
  per sequence (:mod:`trainer_client.attention`: SDPA per segment on CPU), so a row costs the sum of
  its sequences' squared lengths; padded micro-batches run one causal SDPA call each. (Before
  per-sequence attention, a packed row paid a dense ``[L, L]`` block-diagonal mask through Megatron's
  unfused local attention and packing was 3x slower than padding.) ``python -m
  tests.trainer.attention_timing`` times the attention variants alone on these rows;
- ``padding_share_padded``: share of computed positions that were padding in the padded run;
- ``step_s_packed`` / ``step_s_padded`` (wall) and ``cpu_s_packed`` / ``cpu_s_padded`` (this
  process's CPU seconds, less sensitive to other load): median step times, the two kinds of step
  alternated;
- ``dp2_vs_dp1_step_ratio``: median step time of DP=2 (two gloo ranks under ``torchrun``) over
  DP=1 (one rank, also under ``torchrun``), packed: 0.5 would be perfect scaling.

Run: ``rollout bench trainer --json PATH`` (or ``python -m trainer_client.bench worker OUT`` as a rank).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainer_client.batch import Sample
from trainer_client.learner import Batching, Learner, LossConfig
from trainer_client.model import ModelConfig, OptimConfig, ParallelConfig, build_policy, free_port
from trainer_client.ranks import Ranks

MODEL = ModelConfig(vocab_size=512, hidden_size=128, num_layers=4, num_attention_heads=4, num_query_groups=2,
                    ffn_hidden_size=344, max_position_embeddings=2048)  # fmt: skip
BUDGET = 2048  # token slots per micro-batch


def agent_samples(seed: int = 0, groups: int = 4, group_size: int = 8) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        for i in range(group_size):
            prompt = rng.randint(64, 256)
            draw = rng.random()
            response = rng.randint(32, 200) if draw < 0.5 else rng.randint(200, 700) if draw < 0.75 else 1024
            mask = torch.tensor([float(rng.random() < 0.7) for _ in range(response)])
            out.append(Sample(
                key=f"{g}:{i}", tokens=torch.randint(0, MODEL.vocab_size, (prompt + response,)), prompt_len=prompt,
                loss_mask=mask, engine_logprobs=-torch.rand(response) * 4 * mask, advantage=rng.choice((-1.0, 1.0)),
                reward=0.0, staleness=0,
            ))  # fmt: skip
    return out


def time_steps(learner: Learner, samples: list[Sample], steps: int) -> tuple[list[float], Any]:
    learner.step(samples)  # warm-up
    times, stats = [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        stats = learner.step(samples)
        times.append(time.perf_counter() - t0)
    return times, stats


def in_process(steps: int) -> dict[str, float]:
    """Packed vs padded on one rank, their steps alternated so that a change of machine load touches both alike."""
    torch.set_num_threads(1)
    policy = build_policy(MODEL, ParallelConfig(), OptimConfig(lr=1e-5))
    samples = agent_samples()
    learners = {name: Learner(policy, LossConfig(), batching=Batching(BUDGET, packed))
                for name, packed in (("packed", True), ("padded", False))}  # fmt: skip
    for learner in learners.values():
        learner.step(samples)  # warm-up
    wall: dict[str, list[float]] = {name: [] for name in learners}
    cpu: dict[str, list[float]] = {name: [] for name in learners}
    stats: dict[str, Any] = {}
    for _ in range(steps):
        for name, learner in learners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            stats[name] = learner.step(samples)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    out: dict[str, float] = {}
    for name in learners:
        out[f"step_s_{name}"] = statistics.median(wall[name])
        out[f"cpu_s_{name}"] = statistics.median(cpu[name])
        out[f"tokens_per_s_{name}"] = stats[name].sequence_tokens / statistics.median(wall[name])
        out[f"padding_share_{name}"] = 1 - stats[name].sequence_tokens / stats[name].slots
    out["sequence_tokens"] = float(sum(len(s.tokens) - 1 for s in samples))
    return out


def worker(out: Path, steps: int) -> None:
    """One rank of the data-parallel run (under torchrun): rank 0 writes the median step time."""
    torch.set_num_threads(1)
    policy = build_policy(MODEL, ParallelConfig(), OptimConfig(lr=1e-5))
    ranks = Ranks.current()
    learner = Learner(policy, LossConfig(), ranks=ranks, batching=Batching(BUDGET, True))
    times, _ = time_steps(learner, agent_samples(), steps)
    slowest = [max(t) for t in zip(*ranks.gather(times), strict=True)]  # a step ends when its slowest rank does
    if ranks.leader:
        out.write_text(json.dumps({"step_s": statistics.median(slowest), "ranks": ranks.world}))


def data_parallel(nproc: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
                "127.0.0.1", "--master-port", str(free_port()), "-m", "trainer_client.bench", "worker", str(out),
                str(steps)]  # fmt: skip
        subprocess.run(argv, check=True, env=_env(), timeout=1800)
        return float(json.loads(out.read_text())["step_s"])


def run(steps: int = 3) -> dict[str, Any]:
    figures: dict[str, Any] = in_process(steps)
    dp1, dp2 = data_parallel(1, steps), data_parallel(2, steps)
    figures.update(step_s_dp1=dp1, step_s_dp2=dp2, dp2_vs_dp1_step_ratio=dp2 / dp1)
    figures["model"] = MODEL.model_dump()
    figures["micro_batch_tokens"], figures["steps"] = BUDGET, steps
    return figures


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:  # dist_checkpointing-style guard for spawned ranks
    worker(Path(sys.argv[2]), int(sys.argv[3]))

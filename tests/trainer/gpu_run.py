"""The trainer on CUDA GPUs: ``torchrun`` ranks on NCCL, tensor x data parallel, against stand-in engines.

    python -m tests.trainer.gpu_run --nproc 8 --tp 2 --steps 10 --out runs/trainer-gpu   # 8 GPUs: TP=2 x DP=4
    python -m tests.trainer.gpu_run --cpu --nproc 2 --tp 1 --steps 2 --out runs/trainer-smoke  # gloo smoke on CPU

One process here runs an embedded Redis and the stand-in rollout API + proxy of
:mod:`tests.trainer.fake_fleet` (agent-shaped trajectories of ~3.5K tokens stamped with the
version the stand-in proxy last accepted); ``torchrun`` runs ``rollout-train`` with one rank per
GPU (NCCL is picked whenever CUDA is available, gloo otherwise). Afterwards it prints each step's
time breakdown per rank from ``steps.jsonl`` and writes ``breakdown.json``. The model is a
Qwen3-shaped 0.5B-class policy on GPUs (``--cpu``: the tests' tiny model). ``tests/trainer/
test_gpu_run.py`` checks on CPU that these settings parse.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from services.protocol.api import JobCreate
from services.protocol.tasks import RewardSpec, Task
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tokenizer import write_tokenizer_dir
from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.conftest import TINY
from tests.trainer.fake_fleet import serve_fleet
from tests.trainer.launch import torchrun_argv
from trainer_client.metrics import PHASES

GPU_MODEL = {"family": "qwen3", "vocab_size": 32768, "hidden_size": 1024, "num_layers": 16,
             "num_attention_heads": 16, "num_query_groups": 8, "kv_channels": 128, "ffn_hidden_size": 3072,
             "max_position_embeddings": 8192}  # fmt: skip
GPU_SHAPE = {"prompt_len": 512, "turns": 8, "gen_len": 256, "obs_len": 128}  # 512 + 8x256 + 7x128 = 3,456 tokens
CPU_SHAPE = {"prompt_len": 16, "turns": 2, "gen_len": 8, "obs_len": 4}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=8, help="ranks (GPUs)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (the rest is data parallel)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/trainer-gpu"))
    parser.add_argument("--cpu", action="store_true", help="tiny model, gloo: a smoke run without GPUs")
    return parser.parse_args(argv)


def settings_env(args: argparse.Namespace, redis_url: str, url: str, tasks: Path, tokenizer: Path) -> dict[str, str]:
    """``ROLLOUT_TRAIN_*`` for the run (what ``TrainSettings`` reads on every rank)."""
    model = {**TINY, "vocab_size": 260} if args.cpu else GPU_MODEL
    return {
        "ROLLOUT_TRAIN_JOB": "gpu-run", "ROLLOUT_TRAIN_REDIS_URL": redis_url, "ROLLOUT_TRAIN_API_URL": url,
        "ROLLOUT_TRAIN_PROXY_URL": url, "ROLLOUT_TRAIN_TASKS_PATH": str(tasks),
        "ROLLOUT_TRAIN_TOKENIZER_DIR": str(tokenizer), "ROLLOUT_TRAIN_WORK_DIR": str(args.out),
        "ROLLOUT_TRAIN_MODEL": json.dumps(model), "ROLLOUT_TRAIN_PARALLEL__TENSOR_PARALLEL": str(args.tp),
        "ROLLOUT_TRAIN_PARALLEL__RECOMPUTE_ACTIVATIONS": "false" if args.cpu else "true",
        "ROLLOUT_TRAIN_GROUP_SIZE": "8", "ROLLOUT_TRAIN_BATCH_GROUPS": str(max(2, args.nproc // args.tp)),
        "ROLLOUT_TRAIN_MAX_STALENESS": "1", "ROLLOUT_TRAIN_MAX_SEQ_LEN": "4096",
        "ROLLOUT_TRAIN_MICRO_BATCH_TOKENS": "512" if args.cpu else "16384", "ROLLOUT_TRAIN_PACKING": "true",
        "ROLLOUT_TRAIN_OPTIM": json.dumps({"lr": 1e-6, "warmup_steps": 2, "decay": "cosine", "decay_steps": 100}),
        "ROLLOUT_TRAIN_MAX_STEPS": str(args.steps), "ROLLOUT_TRAIN_CHECKPOINT_EVERY": str(args.steps),
        "ROLLOUT_TRAIN_PLOT": "false", "ROLLOUT_TRAIN_WAIT_TIMEOUT_S": "120",
    }  # fmt: skip


def print_breakdown(steps_log: Path) -> dict[str, object]:
    records = [json.loads(line) for line in steps_log.read_text().splitlines() if line.strip()]
    columns = (*PHASES, "total_s")
    print(f"{'step':>4} {'rank':>4} " + " ".join(f"{c.removesuffix('_s'):>12}" for c in columns))
    for r in records:
        for rank, timings in enumerate(r["rank_timings"]):
            print(f"{r['step']:>4} {rank:>4} " + " ".join(f"{timings[c]:>12.3f}" for c in columns))
    steady = records[1:] or records
    median = {c: statistics.median(t[c] for r in steady for t in r["rank_timings"]) for c in columns}
    tokens = statistics.median(r["tokens"] for r in steady)
    return {"median_s": median, "generated_tokens_per_step": tokens, "steps": len(records)}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    tasks = args.out / "tasks.jsonl"
    tasks.write_text("".join(Task(id=f"t{i}", prompt="p", reward=RewardSpec(command="true")).model_dump_json() + "\n"
                             for i in range(16)))  # fmt: skip
    shape = CPU_SHAPE if args.cpu else GPU_SHAPE
    with EmbeddedRedis() as redis_server, serve_fleet(redis_server.url, **shape) as (url, fleet):
        fleet.jobs["gpu-run"] = JobCreate(job="gpu-run")  # the trainer reads the job's pool from the API
        env = settings_env(args, redis_server.url, url, tasks, write_tokenizer_dir(args.out / "tokenizer"))
        env = python_env({**os.environ, **env})
        code = subprocess.run(
            torchrun_argv(args.nproc, "trainer_client.main"), env=env, cwd=REPO_ROOT, check=False
        ).returncode
    if code == 0:
        summary = print_breakdown(args.out / "steps.jsonl")
        (args.out / "breakdown.json").write_text(json.dumps(summary, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())

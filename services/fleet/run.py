"""``rollout up``: warm-start the demo policy, start the fleet, train on it, summarise."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from services.fleet import demo
from services.fleet.launcher import Fleet, FleetConfig
from services.runtime.processes import REPO_ROOT, python_env
from services.runtime.tables import print_table

log = logging.getLogger(__name__)

JOB = "demo"


@dataclass(frozen=True)
class UpOptions:
    work_dir: Path
    steps: int = 20
    engines: int = 1
    concurrency: int = 32
    warm_start_steps: int = 250
    group_size: int = 8
    redis_url: str | None = None
    trainer_ranks: int = 1  # > 1: the trainer runs under torchrun (data parallel; NCCL on GPUs, gloo on CPU)


def run(opts: UpOptions) -> int:
    # SIGTERM unwinds like Ctrl-C, so that every process started below is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    model_dir = opts.work_dir / "model-v0"
    if not (model_dir / "model.safetensors").exists():
        demo.warm_start(model_dir, steps=opts.warm_start_steps)
    fleet = Fleet(FleetConfig(
        work_dir=opts.work_dir, model_dir=model_dir, engines=opts.engines,
        worker_concurrency=opts.concurrency, redis_url=opts.redis_url, context_tokens=demo.CONTEXT_TOKENS,
    ))  # fmt: skip
    fleet.start()
    try:
        token = fleet.create_job(JOB)
        print(f"\ndashboard: {fleet.dashboard_url()}\n", flush=True)
        code = train(fleet, opts, model_dir, token)
    finally:
        fleet.stop()
    summarise(opts.work_dir / "trainer")
    return code


def train(fleet: Fleet, opts: UpOptions, model_dir: Path, token: str) -> int:
    tasks_path = opts.work_dir / "tasks.jsonl"
    tasks_path.write_text("".join(t.model_dump_json() + "\n" for t in demo.tasks()))
    context = str(demo.CONTEXT_TOKENS)
    env = {
        "ROLLOUT_TRAIN_JOB": JOB, "ROLLOUT_TRAIN_REDIS_URL": fleet.redis_url,
        "ROLLOUT_TRAIN_API_URL": fleet.url("api"), "ROLLOUT_TRAIN_API_TOKEN": token,
        "ROLLOUT_TRAIN_PROXY_URL": fleet.url("proxy"), "ROLLOUT_TRAIN_PROXY_TOKEN": token,
        "ROLLOUT_TRAIN_TASKS_PATH": str(tasks_path),
        "ROLLOUT_TRAIN_INIT_FROM": str(model_dir), "ROLLOUT_TRAIN_TOKENIZER_DIR": str(model_dir),
        "ROLLOUT_TRAIN_WORK_DIR": str(opts.work_dir / "trainer"), "ROLLOUT_TRAIN_MAX_STEPS": str(opts.steps),
        "ROLLOUT_TRAIN_GROUP_SIZE": str(opts.group_size), "ROLLOUT_TRAIN_BATCH_GROUPS": str(len(demo.PROMPTS)),
        "ROLLOUT_TRAIN_MAX_STALENESS": "1", "ROLLOUT_TRAIN_MAX_SEQ_LEN": context,
        "ROLLOUT_TRAIN_MODEL__MAX_POSITION_EMBEDDINGS": context, "ROLLOUT_TRAIN_OPTIM__LR": "2e-4",
        "ROLLOUT_TRAIN_LIMITS__MAX_TURNS": "2", "ROLLOUT_TRAIN_LIMITS__MAX_TOKENS_PER_TURN": "96",
        "ROLLOUT_TRAIN_LIMITS__MAX_TRAJECTORY_TOKENS": context, "ROLLOUT_TRAIN_LIMITS__COMMAND_TIMEOUT_S": "10",
        "ROLLOUT_TRAIN_WAIT_TIMEOUT_S": "300", "ROLLOUT_TRAIN_GROUP_TIMEOUT_S": "120",
    }  # fmt: skip
    log.info("training job %r for %d steps on %d rank(s) (trainer log: stdout)", JOB, opts.steps, opts.trainer_ranks)
    proc = subprocess.run(trainer_argv(opts.trainer_ranks), cwd=REPO_ROOT, env=python_env({**os.environ, **env}),
                          check=False)  # fmt: skip
    return proc.returncode


def trainer_argv(ranks: int) -> list[str]:
    """``rollout-train`` alone, or under ``torchrun`` with one process per rank."""
    if ranks == 1:
        return [sys.executable, "-m", "trainer_client.main"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            "-m", "trainer_client.main"]  # fmt: skip


def summarise(trainer_dir: Path) -> None:
    steps_file = trainer_dir / "steps.jsonl"
    if not steps_file.exists():
        print("no training steps were recorded")
        return
    records = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    rows = [
        {
            "step": r.get("step"), "reward": r.get("reward_mean"), "trajectories": r.get("trajectories"),
            "logprob_gap": r.get("logprob_gap"), "ess": r.get("ess"),
            "wait_s": r.get("timings", {}).get("wait_rollouts_s"), "total_s": r.get("timings", {}).get("total_s"),
            "update_s_per_rank": " ".join(f"{t.get('update_s', 0):.2f}" for t in r.get("rank_timings", [])),
        }
        for r in records
    ]  # fmt: skip
    print_table("demo training run (reward = share of episodes that wrote the asked word)", rows)
    if (trainer_dir / "steps.png").exists():
        print(f"\nplot: {trainer_dir / 'steps.png'}")

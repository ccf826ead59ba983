"""``rollout demo`` / ``rollout up``: a tiny policy learns held-out shell tasks through the whole platform.

The recipe: make the task splits and the imperfect teacher's demonstrations (:mod:`services.fleet.demo`),
start the fleet (:mod:`services.fleet.launcher`), create a training job and an evaluation job on
the same pool, then run the trainer (:mod:`trainer_client`): held-out pass@1 of the untrained
policy, SFT on the demonstrations, pass@1 again, asynchronous GRPO with pass@1 every few steps
and at the end. The summary (JSON) and the figure come from the trainer's step and eval logs
(:mod:`services.fleet.summary`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.fleet import demo, jobs, shell_tasks, summary
from services.fleet.launcher import Fleet, FleetConfig
from services.protocol.fields import DEFAULT_POOL
from services.runtime.processes import REPO_ROOT, python_env

log = logging.getLogger(__name__)

JOB = "demo"
EVAL_JOB = "demo-eval"


@dataclass(frozen=True)
class UpOptions:
    work_dir: Path
    steps: int = 40  # GRPO steps
    seed: int = 0  # task splits, teacher, initial weights
    json_path: Path | None = None
    engines: int = 0  # 0: two, or with --jobs one per unit of weight (1 + 2 + ...)
    concurrency: int = 32
    sft_steps: int = 400
    teacher_accuracy: float = 0.5  # share of demonstrations with the right operation
    train_tasks: int = 2000
    heldout_tasks: int = 128
    eval_every: int = 10
    group_size: int = 8
    batch_groups: int = 4
    lr: float = 5e-4  # GRPO's (SFT's is the trainer's default, 3e-3); 1e-3 and 2e-3 collapsed the format
    shape: demo.ModelShape = field(default_factory=demo.ModelShape)
    redis_url: str | None = None
    trainer_ranks: int = 1  # > 1: the trainer runs under torchrun (data parallel; NCCL on GPUs, gloo on CPU)
    jobs: int = 1  # > 1: that many training jobs share the fleet, each with its own pool of engines, weights 1:2:..


@dataclass(frozen=True)
class JobSpec:
    """One training job of the run: its evaluation job (``name`` itself with ``--jobs``), its pool of
    engines, its fair-share weight."""

    name: str
    eval_job: str
    pool: str
    weight: float
    work_dir: Path  # its trainer writes <work_dir>/trainer

    @property
    def trainer_dir(self) -> Path:
        return self.work_dir / "trainer"


def engine_pools(specs: list[JobSpec], engines: int) -> tuple[str, ...]:
    """Each engine's pool: every job gets one, the rest go by weight (largest shortfall first), so a
    job's share of the engines (what bounds its throughput) follows its fair-share weight."""
    total = sum(spec.weight for spec in specs)
    counts = [1] * len(specs)
    while sum(counts) < engines:
        i = max(range(len(specs)), key=lambda i: specs[i].weight / total * engines - counts[i])
        counts[i] += 1
    return tuple(spec.pool for spec, count in zip(specs, counts, strict=True) for _ in range(count))


def job_specs(opts: UpOptions) -> list[JobSpec]:
    if opts.jobs == 1:
        return [JobSpec(JOB, EVAL_JOB, DEFAULT_POOL, 1.0, opts.work_dir)]
    # with --jobs, a job evaluates in itself (``mode="eval"`` rollouts, its own eval stream): its
    # evaluations are its work on the fleet, under its own fair-share weight, like its training
    return [JobSpec(f"{JOB}-{i}", f"{JOB}-{i}", f"{JOB}-{i}", float(i + 1), opts.work_dir / f"job-{i}")
            for i in range(opts.jobs)]  # fmt: skip


def run(opts: UpOptions) -> int:
    # SIGTERM unwinds like Ctrl-C, so that every process started below is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    specs = job_specs(opts)
    engines = opts.engines or (2 if opts.jobs == 1 else int(sum(spec.weight for spec in specs)))
    if engines < len(specs):
        print(f"error: --jobs {opts.jobs} needs at least that many engines (--engines {engines})", file=sys.stderr)
        return 2
    model_dir = prepare(opts, specs)
    fleet = Fleet(FleetConfig(
        work_dir=opts.work_dir, model_dir=model_dir, engines=engines, worker_concurrency=opts.concurrency,
        redis_url=opts.redis_url, context_tokens=demo.CONTEXT_TOKENS, pools=engine_pools(specs, engines),
    ))  # fmt: skip
    fleet.start()
    try:
        envs = [trainer_env(fleet, opts, model_dir, spec) for spec in specs]
        print(f"\ndashboard: {fleet.dashboard_url()}\n", flush=True)
        if len(specs) == 1:
            code = train(opts, envs[0])
        else:
            code, shared = jobs.train_together(fleet, specs, [trainer_cmd(opts, env) for env in envs], opts.steps)
    finally:
        fleet.stop()
    wall_s = time.monotonic() - started
    if len(specs) > 1:
        return jobs.report(opts, specs, shared, wall_s) if code == 0 else code
    figures = summary.report(opts, wall_s)
    if code == 0 and opts.steps > 0 and not figures["steps"]:
        print(
            "error: the trainer exited without recording a GRPO step (see its log above: usually no complete "
            "batch of trajectories arrived within ROLLOUT_TRAIN_WAIT_TIMEOUT_S)",
            file=sys.stderr,
        )
        return 1
    return code


def prepare(opts: UpOptions, specs: list[JobSpec]) -> Path:
    """Task files, demonstrations and the initial policy; a previous run's trainer state is removed (a fresh run)."""
    model_dir = opts.work_dir / "model-v0"
    for old in (*(spec.trainer_dir for spec in specs), model_dir):
        shutil.rmtree(old, ignore_errors=True)
    train_set, heldout = shell_tasks.splits(opts.seed, opts.train_tasks, opts.heldout_tasks)
    demo.write_tasks(opts.work_dir / "tasks.jsonl", train_set)
    demo.write_tasks(opts.work_dir / "heldout.jsonl", heldout)
    demo.initial_model(model_dir, opts.shape, opts.seed)
    demo.write_demonstrations(opts.work_dir / "sft.jsonl", train_set, model_dir, opts.teacher_accuracy, opts.seed)
    return model_dir


def trainer_env(fleet: Fleet, opts: UpOptions, model_dir: Path, spec: JobSpec) -> dict[str, str]:
    """Create the job and its evaluation job (unless it evaluates in itself) on the spec's pool; the
    trainer's environment."""
    token = fleet.create_job(spec.name, spec.pool, spec.weight)
    eval_token = token if spec.eval_job == spec.name else fleet.create_job(spec.eval_job, spec.pool)
    w, context = opts.work_dir, str(demo.CONTEXT_TOKENS)
    env = {
        "ROLLOUT_TRAIN_JOB": spec.name, "ROLLOUT_TRAIN_REDIS_URL": fleet.redis_url,
        "ROLLOUT_TRAIN_API_URL": fleet.url("api"), "ROLLOUT_TRAIN_API_TOKEN": token,
        "ROLLOUT_TRAIN_PROXY_URL": fleet.url("proxy"), "ROLLOUT_TRAIN_PROXY_TOKEN": token,
        "ROLLOUT_TRAIN_TASKS_PATH": str(w / "tasks.jsonl"),
        "ROLLOUT_TRAIN_INIT_FROM": str(model_dir), "ROLLOUT_TRAIN_TOKENIZER_DIR": str(model_dir),
        "ROLLOUT_TRAIN_WORK_DIR": str(spec.trainer_dir), "ROLLOUT_TRAIN_MAX_STEPS": str(opts.steps),
        "ROLLOUT_TRAIN_GROUP_SIZE": str(opts.group_size), "ROLLOUT_TRAIN_BATCH_GROUPS": str(opts.batch_groups),
        "ROLLOUT_TRAIN_MAX_STALENESS": "1", "ROLLOUT_TRAIN_MAX_SEQ_LEN": context,
        "ROLLOUT_TRAIN_OPTIM__LR": str(opts.lr), "ROLLOUT_TRAIN_CHECKPOINT_EVERY": "1000",
        # cosine decay to a tenth of the rate by the last step: late steps refine instead of drifting
        "ROLLOUT_TRAIN_OPTIM__DECAY": "cosine", "ROLLOUT_TRAIN_OPTIM__DECAY_STEPS": str(max(1, opts.steps)),
        "ROLLOUT_TRAIN_OPTIM__MIN_LR": str(opts.lr / 10),
        # the whole step in one padded micro-batch (sequences are all ~240 tokens, so padding them costs
        # little and one batched forward far less than one per sequence; the measured recipe) and one
        # thread (the engines share the cores; two threads each oversubscribe them)
        "ROLLOUT_TRAIN_PACKING": "false", "ROLLOUT_TRAIN_MICRO_BATCH_TOKENS": "8192", "OMP_NUM_THREADS": "1",
        "ROLLOUT_TRAIN_MODEL__SEED": str(opts.seed),
        "ROLLOUT_TRAIN_LIMITS__MAX_TURNS": "1", "ROLLOUT_TRAIN_LIMITS__MAX_TOKENS_PER_TURN": "96",
        "ROLLOUT_TRAIN_LIMITS__MAX_TRAJECTORY_TOKENS": context, "ROLLOUT_TRAIN_LIMITS__COMMAND_TIMEOUT_S": "10",
        "ROLLOUT_TRAIN_WAIT_TIMEOUT_S": "300", "ROLLOUT_TRAIN_GROUP_TIMEOUT_S": "120",
        "ROLLOUT_TRAIN_SFT__PATH": str(w / "sft.jsonl"), "ROLLOUT_TRAIN_SFT__STEPS": str(opts.sft_steps),
        "ROLLOUT_TRAIN_SFT__SEED": str(opts.seed),
        "ROLLOUT_TRAIN_EVALUATION__TASKS_PATH": str(w / "heldout.jsonl"),
        "ROLLOUT_TRAIN_EVALUATION__JOB": spec.eval_job, "ROLLOUT_TRAIN_EVALUATION__TOKEN": eval_token,
        "ROLLOUT_TRAIN_EVALUATION__EVERY": str(opts.eval_every),
        # every evaluation of the run uses the same sampling seeds (task t: seed + t): versions are
        # compared on the same random draws (a paired comparison), and each task has draws of its own
        "ROLLOUT_TRAIN_EVALUATION__SEED": str(opts.seed * 1000),
        **opts.shape.trainer_env(),
    }  # fmt: skip
    log.info("training job %r (pool %r, weight %g): SFT %d steps, then GRPO %d steps on %d rank(s)", spec.name,
             spec.pool, spec.weight, opts.sft_steps, opts.steps, opts.trainer_ranks)  # fmt: skip
    return env


def trainer_cmd(opts: UpOptions, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    return trainer_argv(opts.trainer_ranks), python_env({**os.environ, **env})


def train(opts: UpOptions, env: dict[str, str]) -> int:
    """One trainer, its log on stdout."""
    argv, full_env = trainer_cmd(opts, env)
    return subprocess.run(argv, cwd=REPO_ROOT, env=full_env, check=False).returncode


def trainer_argv(ranks: int) -> list[str]:
    """``rollout-train`` alone, or under ``torchrun`` with one process per rank."""
    if ranks == 1:
        return [sys.executable, "-m", "trainer_client.main"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            "-m", "trainer_client.main"]  # fmt: skip

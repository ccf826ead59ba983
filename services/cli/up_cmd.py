"""``rollout demo`` and ``rollout up``: the whole platform on this machine, a tiny policy learning held-out shell tasks.

``demo`` is the recipe with its figures (``--json``); ``up`` is the same run, kept for the
flags it always had (``--warm-start-steps`` is now the SFT phase's steps).
"""

from __future__ import annotations

import argparse
from pathlib import Path

# the recipe's defaults, as in services.fleet.run.UpOptions (not imported here: every command would pay for it)
STEPS, SFT_STEPS, HELDOUT, EVAL_EVERY, LR, TEACHER = 40, 400, 128, 10, 5e-4, 0.5
CONCURRENCY, JOBS_CONCURRENCY = 32, 8  # at 32 two jobs' trainers bound their throughput (share 0.41 : 0.59)


def _common(p: argparse.ArgumentParser, work_dir: str) -> None:
    p.add_argument("--work-dir", type=Path, default=Path(work_dir), help="logs, model, checkpoints, plots")
    p.add_argument("--steps", type=int, default=STEPS, help=f"GRPO steps after SFT (default {STEPS})")
    p.add_argument("--seed", type=int, default=0, help="task splits, teacher and initial weights")
    p.add_argument("--engines", type=int, default=0,
                   help="torch engines (default 2; with --jobs, 1 + 2 + ...: engines split by weight)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=None,
                   help=f"episodes at once in the worker (default {CONCURRENCY}; with --jobs, {JOBS_CONCURRENCY}: "
                        "the fleet, not the trainers, is then the bottleneck and the weighted fair share "
                        "decides the split)")  # fmt: skip
    p.add_argument("--heldout", type=int, default=HELDOUT, help=f"held-out tasks evaluated (default {HELDOUT})")
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="GRPO steps between held-out evaluations")
    p.add_argument("--lr", type=float, default=LR, help=f"GRPO learning rate (default {LR})")
    p.add_argument(
        "--teacher-accuracy", type=float, default=TEACHER, help="share of SFT demonstrations with the right operation"
    )
    p.add_argument("--redis-url", default=None, help="default: an embedded server")
    p.add_argument("--trainer-ranks", type=int, default=1, help="trainer processes under torchrun (data parallel)")
    p.add_argument("--jobs", type=int, default=1,
                   help="training jobs sharing the fleet, weights 1:2:..., one pool of engines each")  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="SFT then GRPO of a tiny policy on held-out shell tasks; pass@1 JSON and plots")
    _common(p, "runs/demo")
    p.add_argument("--json", type=Path, default=None, help="write the summary (pass@1 base / SFT / RL, ...) here")
    p.add_argument("--sft-steps", type=int, default=SFT_STEPS, help="SFT optimizer steps before GRPO")
    p.set_defaults(handler=run)
    p = sub.add_parser("up", help="run the whole fleet here and train a tiny policy (the demo without --json)")
    _common(p, "runs/up")
    p.add_argument("--warm-start-steps", dest="sft_steps", type=int, default=SFT_STEPS, help="SFT steps before GRPO")
    p.set_defaults(handler=run, json=None)


def run(args: argparse.Namespace) -> int:
    from services.fleet.run import UpOptions
    from services.fleet.run import run as run_demo  # torch and transformers load only here

    return run_demo(UpOptions(
        work_dir=args.work_dir, steps=args.steps, seed=args.seed, json_path=args.json, engines=args.engines,
        concurrency=args.concurrency or (JOBS_CONCURRENCY if args.jobs > 1 else CONCURRENCY),
        sft_steps=args.sft_steps, heldout_tasks=args.heldout,
        eval_every=args.eval_every, redis_url=args.redis_url, trainer_ranks=args.trainer_ranks, lr=args.lr,
        teacher_accuracy=args.teacher_accuracy, jobs=args.jobs,
    ))  # fmt: skip

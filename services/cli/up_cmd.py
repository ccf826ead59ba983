"""``rollout up``: the whole platform on this machine, training a tiny policy on a miniature task."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="run the whole fleet here and train a tiny policy on a miniature task")
    p.add_argument("--work-dir", type=Path, default=Path("runs/up"), help="logs, model, checkpoints, plots")
    p.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    p.add_argument("--engines", type=int, default=1, help="torch engines serving the policy")
    p.add_argument("--concurrency", type=int, default=32, help="episodes at once in the worker")
    p.add_argument("--warm-start-steps", type=int, default=250, help="format fine-tuning steps before RL")
    p.add_argument("--redis-url", default=None, help="default: an embedded server")
    p.add_argument("--trainer-ranks", type=int, default=1, help="trainer processes under torchrun (data parallel)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.fleet.run import UpOptions
    from services.fleet.run import run as run_up  # torch and transformers load only here

    return run_up(UpOptions(
        work_dir=args.work_dir, steps=args.steps, engines=args.engines, concurrency=args.concurrency,
        warm_start_steps=args.warm_start_steps, redis_url=args.redis_url, trainer_ranks=args.trainer_ranks,
    ))  # fmt: skip

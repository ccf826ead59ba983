"""``rollout worker``: a rollout worker process (run as many as you like, on as many machines)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.cli.flags import overrides


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run a rollout worker (agent episodes from the jobs' work streams)")
    p.add_argument("--redis-url", default=None, help="default: ROLLOUT_WORKER_REDIS_URL, ROLLOUT_REDIS_URL")
    p.add_argument("--proxy-url", default=None)
    p.add_argument("--broker-url", default=None)
    p.add_argument("--model-path", type=Path, default=None, help="tokenizer directory of the policy")
    p.add_argument("--pool-model-path", action="append", default=None, metavar="POOL=DIR", dest="pool_model_paths",
                   help="the served model's directory of a proxy pool (its tokenizer; repeatable)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=None, help="episodes at once in this process")
    p.add_argument("--port", type=int, default=None, help="/healthz and /metrics port (default: a free one)")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--jobs", type=lambda s: s.split(","), default=None, help="serve only these jobs (comma-separated)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.rollout_api.settings import WorkerSettings
    from services.rollout_api.worker.main import run as run_worker

    names = ("redis_url", "proxy_url", "broker_url", "model_path", "concurrency", "port", "worker_id", "jobs")
    settings = overrides(args, names)
    if args.pool_model_paths:
        settings["pool_model_paths"] = dict(item.split("=", 1) for item in args.pool_model_paths)
    return run_worker(WorkerSettings(**settings))

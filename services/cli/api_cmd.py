"""``rollout api``: the rollout API (stateless; run as many as you like behind a load balancer)."""

from __future__ import annotations

import argparse

from services.cli.flags import overrides


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("api", help="run the rollout API (POST /rollouts, jobs, trajectory SSE)")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--redis-url", default=None, help="default: ROLLOUT_API_REDIS_URL, ROLLOUT_REDIS_URL, embedded")
    p.add_argument("--broker-url", default=None, help="check task templates against this broker")
    p.add_argument("--proxy-url", default=None, help="the LLM proxy whose pools and engines the dashboard shows")
    p.add_argument("--tokenizer-path", default=None, help="policy tokenizer dir: the viewer shows token texts")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.rollout_api.main import run as run_api
    from services.rollout_api.settings import ApiSettings

    names = ("host", "port", "redis_url", "broker_url", "proxy_url", "tokenizer_path")
    return run_api(ApiSettings(**overrides(args, names)))

"""``rollout``: one command, one subcommand per process kind.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(args) -> int``. Entrypoints stay thin: parse, configure logging,
build the settings, run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.cli import (
    agents_cmd,
    api_cmd,
    bench_cmd,
    broker_cmd,
    deploy_cmd,
    engine_cmd,
    images_cmd,
    proxy_cmd,
    redis_cmd,
    secrets_cmd,
    settings_cmd,
    tasks_cmd,
    tokenizer_cmd,
    trajectories_cmd,
    up_cmd,
    worker_cmd,
)
from services.runtime.logs import configure_logging

COMMANDS = (up_cmd, redis_cmd, engine_cmd, proxy_cmd, broker_cmd, api_cmd, worker_cmd, bench_cmd, deploy_cmd,
            images_cmd, tasks_cmd, tokenizer_cmd, trajectories_cmd, secrets_cmd, settings_cmd, agents_cmd)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollout", description="Rollout-as-a-service for agentic RL: services, tools and benchmarks."
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

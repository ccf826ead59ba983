"""``rollout``: one command, one subcommand per process kind.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(args) -> int``. Entrypoints stay thin: parse, configure logging,
build the settings, run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from services.runtime.logs import configure_logging

# subcommand -> the module that registers it, in ``rollout --help``'s order. A process imports only its own
# command's module: the benchmarks, the proxy's and the engine's imports cost a service about a CPU second
# at every start otherwise (``python -X importtime -m services.cli broker --help``).
COMMANDS = {"demo": "up_cmd", "up": "up_cmd", "redis": "redis_cmd", "engine": "engine_cmd", "proxy": "proxy_cmd",
            "broker": "broker_cmd", "api": "api_cmd", "worker": "worker_cmd", "bench": "bench_cmd",
            "deploy": "deploy_cmd", "images": "images_cmd", "tasks": "tasks_cmd", "tokenizer": "tokenizer_cmd",
            "trajectories": "trajectories_cmd", "secrets": "secrets_cmd", "settings": "settings_cmd",
            "agents": "agents_cmd"}  # fmt: skip


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or only ``command``'s parser when it names one (what ``main`` parses with)."""
    parser = argparse.ArgumentParser(
        prog="rollout", description="Rollout-as-a-service for agentic RL: services, tools and benchmarks."
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
        importlib.import_module(f"services.cli.{module}").register(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, if any: its first word that is neither an option nor --log-level's value."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``rollout bench NAME``: the platform's benchmarks. Each prints a table and writes JSON."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from types import FrameType

from services.benchmarks import (
    agents,
    broker,
    capacity,
    chaos,
    codec,
    envs,
    fleet,
    gateway,
    proxy,
    swe,
    trainer,
    trainers,
    turn,
)

BENCHMARKS = (codec, proxy, broker, fleet, trainer, trainers, swe, envs, gateway, turn, capacity, agents, chaos)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark (prints a table, writes JSON)")
    bench_sub = p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for module in BENCHMARKS:
        module.register(bench_sub)
    for parser in bench_sub.choices.values():
        parser.set_defaults(handler=ended_by_sigterm(parser.get_default("handler")))


def ended_by_sigterm(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with SIGTERM (``timeout``, a CI's cancel, ``kill``) ending it as an exception does: its
    ``finally`` blocks stop the services it started and remove their sandboxes, which SIGTERM's default
    action skips (they run in sessions of their own, so they outlived a killed benchmark). The exit
    status is still 143. Only the first SIGTERM raises: the cleanup it starts runs to its end."""

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)  # a handler, not SIG_IGN: children must not inherit it
        raise SystemExit(128 + signum)

    def handler(args: argparse.Namespace) -> int:
        signal.signal(signal.SIGTERM, terminated)
        return run(args)

    return handler

"""``rollout bench NAME``: the platform's benchmarks. Each prints a table and writes JSON."""

from __future__ import annotations

import argparse

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

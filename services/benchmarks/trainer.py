"""``rollout bench trainer``: trainer step speed on CPU (packed vs padded, DP=2 vs DP=1).

The measurement lives with the trainer (:mod:`trainer_client.bench`); this prints and writes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from services.benchmarks.report import write_json
from services.runtime.tables import print_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trainer", help="trainer step: packed vs padded micro-batches, two data-parallel ranks vs one")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration (after one warm-up)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from trainer_client import bench  # torch and megatron-core load only for this benchmark

    figures = bench.run(args.steps)
    keys = ("tokens_per_s_packed", "tokens_per_s_padded", "cpu_s_packed", "cpu_s_padded", "padding_share_padded",
            "step_s_dp1", "step_s_dp2", "dp2_vs_dp1_step_ratio")  # fmt: skip
    print_table("trainer step on CPU (one thread per rank)", [{k: figures[k] for k in keys}])
    if args.json:
        write_json(args.json, figures)
    return 0

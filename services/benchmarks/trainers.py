"""``rollout bench trainers``: TRL's recipe through a whole local fleet (``services.benchmarks.trl_recipe``).

Figures: ``trl_steps`` (optimizer steps done), ``trl_tokens_match`` (share of trained samples whose
completion ids and env mask TRL trained on are the trajectory's response ids and loss mask: 1.0),
``trl_weight_versions_served`` (distinct weight versions that served the episodes: one per step),
``step_s_p50`` (a TRL step: rollout, loss, optimizer, weight sync) and ``wait_rollouts_share`` (the
share of TRL's step time spent waiting on the platform).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from services.benchmarks.report import write_json
from services.runtime.tables import print_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trainers", help="TRL's GRPOTrainer through a local fleet: token match, versions served")
    p.add_argument("--steps", type=int, default=5, help="TRL optimizer steps")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import warnings

    from services.benchmarks.trl_recipe import Recipe, run_recipe  # torch, transformers and TRL load only here

    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
    _, figures = run_recipe(Recipe(steps=args.steps))
    keys = ("trl_steps", "trl_tokens_match", "trl_weight_versions_served", "step_s_p50", "wait_rollouts_share")
    print_table("TRL GRPOTrainer through the platform (CPU, tiny model)", [{k: figures[k] for k in keys}])
    if args.json:
        write_json(args.json, figures)
    return 0 if figures["trl_tokens_match"] == 1.0 and figures["trl_steps"] == args.steps else 1

"""``rollout agents``: agent bundles on a broker host (``install NAME``, ``list``); docs/agents.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agents", help="install agent bundles (PyPI/npm harnesses) for the broker's sandboxes")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    install = verbs.add_parser("install", help="build NAME's bundle from its registry into --dir")
    install.add_argument("name", help="a recipe: mini-swe-agent, aider, claude-code, codex")
    install.add_argument("--version", default=None, help="the package's version (default: the latest)")
    _dir_flag(install)
    install.set_defaults(handler=run_install)
    listing = verbs.add_parser("list", help="the bundles in --dir and the recipes")
    _dir_flag(listing)
    listing.set_defaults(handler=run_list)


def _dir_flag(p: argparse.ArgumentParser) -> None:
    default = os.environ.get("ROLLOUT_BROKER_AGENTS_DIR")
    p.add_argument("--dir", type=Path, default=Path(default) if default else None, required=default is None,
                   help="the broker's agents_dir (default: ROLLOUT_BROKER_AGENTS_DIR)")  # fmt: skip


def run_install(args: argparse.Namespace) -> int:
    from services.sandbox_broker.bundles import RECIPES, install

    if args.name not in RECIPES:
        sys.stderr.write(f"no recipe {args.name!r}; recipes: {', '.join(sorted(RECIPES))}\n")
        return 2
    bundle = install(args.name, args.dir.resolve(), args.version)
    sys.stdout.write(f"{bundle.name} {bundle.version} {bundle.digest} -> {args.dir / bundle.name}\n")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from services.sandbox_broker.bundles import RECIPES, installed

    found = {b.name: b for b in installed(args.dir)}
    for name in sorted(set(RECIPES) | set(found)):
        bundle = found.get(name)
        state = f"{bundle.version} {bundle.digest}" if bundle else "not installed"
        sys.stdout.write(f"{name:16} {state}\n")
    return 0

"""``rollout tasks build``: SWE-style tasks from PyPI libraries' sdists (see services/taskbuild)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.cli import tasks_import

DEFAULT_CACHE = Path.home() / ".cache" / "rollout" / "tasks"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tasks", help="build SWE-style tasks (images + instance records), import others' task sets")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="build the shipped tasks into OUT (images/, blobs/, tasks.json)")
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="downloads and the base image")
    build.add_argument("--base", type=Path, default=None, help="a root filesystem tar instead of mmdebstrap's")
    build.add_argument("--only", nargs="*", default=None, help="task ids (default: all)")
    build.set_defaults(handler=run)
    tasks_import.register(actions)


def run(args: argparse.Namespace) -> int:
    from services.taskbuild.builder import build

    instances = build(args.out, args.cache, base=args.base, only=args.only)
    for instance in instances:
        print(f"{instance['instance_id']:<28} F2P={len(instance['FAIL_TO_PASS']):<3} "
              f"P2P={len(instance['PASS_TO_PASS']):<3} {instance['image_path']}")  # fmt: skip
    print(f"{len(instances)} tasks in {args.out / 'tasks.json'}")
    return 0

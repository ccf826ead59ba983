"""``rollout trajectories export|import``: a job's trajectories to and from a JSON-lines dump."""

from __future__ import annotations

import argparse
from pathlib import Path

import redis

from services.cli.flags import overrides


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trajectories", help="export a job's trajectories to a JSONL dump, or import one")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write every trajectory of a job's stream to FILE (.gz: gzip)")
    export.add_argument("--job", required=True)
    export.add_argument("--out", type=Path, required=True)
    export.add_argument("--format", default="jsonl", choices=("jsonl", "atif"),
                        help="jsonl: the platform's records; atif: one Harbor ATIF document per line")  # fmt: skip
    export.set_defaults(handler=run_export)
    load = actions.add_parser("import", help="append a dump's trajectories (records or ATIF) to their job's stream")
    load.add_argument("--file", type=Path, required=True)
    load.add_argument("--job", default=None, help="put every record into this job's stream instead")
    load.set_defaults(handler=run_import)
    for parser in (export, load):
        parser.add_argument("--redis-url", default=None, help="default: ROLLOUT_REDIS_URL")


def _client(args: argparse.Namespace) -> redis.Redis:
    from services.rollout_api.dump import DumpSettings
    from services.runtime.sync_redis import open_sync_redis

    settings = DumpSettings(**overrides(args, ("redis_url",)))
    return open_sync_redis(settings.require_redis_url())


def run_export(args: argparse.Namespace) -> int:
    from services.rollout_api.dump import export_job

    with _client(args) as client:
        count = export_job(client, args.job, args.out, args.format)
    print(f"exported {count} trajectories of job {args.job!r} to {args.out}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from services.rollout_api.dump import import_dump

    with _client(args) as client:
        count = import_dump(client, args.file, args.job)
    print(f"imported {count} trajectories from {args.file}")
    return 0

"""``rollout secrets``: a fresh set of deployment secrets as an env file (compose's ``.env``, or
``kubectl create secret generic rollout-secrets --from-env-file=...``); docs/security.md."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("secrets", help="print fresh tokens and a Redis password as an env file")
    p.add_argument("--redis-host", default="redis:6379", help="host:port in ROLLOUT_REDIS_URL (compose: redis:6379)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.runtime.secrets import FleetSecrets

    secrets = FleetSecrets.generate()
    sys.stdout.write(secrets.env_file())
    sys.stdout.write(f"ROLLOUT_REDIS_URL=redis://:{secrets.redis_password}@{args.redis_host}/0\n")
    return 0

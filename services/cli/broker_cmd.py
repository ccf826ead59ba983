"""``rollout broker``: the sandbox broker (settings from ``ROLLOUT_BROKER_*``, flags override)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.cli.flags import overrides


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("broker", help="run the sandbox broker (leases over local, docker or e2b sandboxes)")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--backend", choices=("local", "docker", "e2b"), default=None)
    p.add_argument("--redis-url", default=None, help="default: ROLLOUT_BROKER_REDIS_URL, ROLLOUT_REDIS_URL, embedded")
    p.add_argument("--instance", default=None, help="replica name, stable across restarts (default host:port)")
    p.add_argument("--state-dir", type=Path, default=None, help="local sandboxes' directories")
    p.add_argument("--warm-pool", type=int, dest="default_warm_pool", default=None,
                   help="warm-pool target of the default template")  # fmt: skip
    p.add_argument("--allow-unisolated", action="store_true", default=None,
                   help="UNSAFE: run local commands unisolated when bubblewrap cannot isolate them")  # fmt: skip
    p.add_argument("--allow-anonymous", action="store_true", default=None,
                   help="UNSAFE, development only: calls without a token act as admin")  # fmt: skip
    p.add_argument("--template-roots", default=None, help="':'-separated directories template rootfs may come from")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.sandbox_broker.main import run as serve
    from services.sandbox_broker.settings import BrokerSettings

    names = ("host", "port", "backend", "redis_url", "instance", "state_dir", "default_warm_pool", "allow_unisolated",
             "allow_anonymous", "template_roots")  # fmt: skip
    return serve(BrokerSettings(**overrides(args, names)))

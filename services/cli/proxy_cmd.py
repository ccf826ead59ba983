"""``rollout proxy``: the LLM proxy (``ROLLOUT_PROXY_*`` settings, then the shared ``ROLLOUT_*`` ones)."""

from __future__ import annotations

import argparse

from services.cli.flags import overrides
from services.llm_proxy.server import run as run_proxy
from services.llm_proxy.settings import ProxySettings

FLAGS: dict[str, type] = {
    "host": str,
    "port": int,
    "redis_url": str,
    "workers": int,
    "engines": str,
    "pool": str,
    "pools": str,
    "context_cap": int,
    "max_new_tokens_cap": int,
    "default_deadline_s": float,
    "connect_timeout_s": float,
    "health_interval_s": float,
    "eject_after_failures": int,
    "engine_max_in_flight": int,
    "queue_max_calls": int,
    "queue_max_bytes": int,
    "queue_wait_s": float,
    "listen_backlog": int,
    "max_body_bytes": int,
    "gateway_tokenizers": str,
    "gateway_tool_parsers": str,
    "gateway_routed_experts": str,
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("proxy", help="the LLM proxy in front of SGLang engines")
    for name, kind in FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return run_proxy(ProxySettings(**overrides(args, FLAGS)))

"""``rollout engine``: simulated SGLang engines (``sim``) or scripted ones, for tests and load tests."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.cli.flags import overrides
from services.engines.settings import EngineSettings

# flag -> type; every flag maps to the EngineSettings field of the same name
FLAGS: dict[str, type] = {
    "port": int,
    "count": int,
    "host": str,
    "model_path": Path,
    "served_model_name": str,
    "script": Path,
    "seed": int,
    "weight_version": str,
    "context_length": int,
    "max_running_requests": int,
    "kv_capacity_tokens": int,
    "prefill_s_per_token": float,
    "decode_step_s": float,
    "decode_step_per_request_s": float,
    "output_tokens": int,
    "runaway_fraction": float,
    "eos_token_id": int,
    "weight_load_s": float,
    "prefix_cache_entries": int,
    "proxy_url": str,
    "pool": str,
    "advertise_host": str,
    "tp_size": int,
    "mem_fraction_static": float,
    "startup_timeout_s": float,
    "weight_cache_dir": Path,
    "stage_port": int,
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "engine", help="SGLang-compatible stand-in engine(s), or a real SGLang server (ROLLOUT_ENGINE_* settings)"
    )
    p.add_argument("--mode", choices=("sim", "scripted", "torch", "sglang"), default=None)
    for name, kind in FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    p.add_argument("--fail-weight-updates", action="store_true", default=None, help="fault injection")
    p.add_argument("--return-routed-experts", action="store_true", default=None, help="sglang: MoE routing replay")
    p.add_argument("sglang_args", nargs="*", default=None, help="sglang: extra server flags, after --")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    chosen = overrides(args, ("mode", "fail_weight_updates", "return_routed_experts", *FLAGS))
    if args.sglang_args:
        chosen["sglang_args"] = args.sglang_args
    from services.engines.main import run as run_engines  # tokenizers loads only for this command

    return run_engines(EngineSettings(**chosen))

"""``rollout bench capacity``: the cores, Redis operations per second and Redis Cluster shards the
seed's fleet (24 engines, 384 sandboxes, about 75 turns/s) needs, and 10x and 100x of it.

Costs are measured in the same run, on the fleet bench's stack (``fleet.start_fleet``): a window of
the idle stack, a window at a small N of the workload's episodes and a window of short episodes
(two turns each, so a lease per two turns) give each role's idle CPU, marginal CPU per LLM turn and
per sandbox lease (the two busy windows solved together), Redis commands per turn and per lease
(INFO commandstats), and what one Redis core serves of this command mix (marginal commands per
marginal Redis CPU second). The model is in ``capacity_model``. The check runs the largest N this
machine holds (``--check-in-flight``) in the same stack, at a pace (``--check-time-scale``) that
keeps the machine below saturation, as the model's deployments are (a starved process serves more
events per wake-up, so its CPU per turn falls), and compares the control-plane CPU the costs predict
at its measured turn and lease rates with the CPU it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from services.benchmarks import fleet
from services.benchmarks import fleet_workload as workload
from services.benchmarks.capacity_fleet import Window, measure_window
from services.benchmarks.capacity_model import (
    ROLES,
    SCALE_FACTORS,
    SEED_ENGINES,
    SEED_SANDBOXES,
    SEED_TURNS_PER_S,
    Costs,
    Scale,
    parse_replicas,
    per_turn_and_per_lease,
    plan,
)
from services.benchmarks.report import write_json
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.tables import print_table
from services.sandbox_broker.backends.leftovers import remove_state_dir


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("capacity", help="cores, Redis ops/s and shards for 1x, 10x and 100x the seed's fleet")
    p.add_argument("--in-flight", type=int, default=64, help="episodes in flight of the cost measurement")
    p.add_argument("--check-in-flight", type=int, default=384, help="N of the check (0: skip it)")
    p.add_argument(
        "--short-in-flight",
        type=int,
        default=16,
        help="short episodes in flight of the per-lease cost (0: all the cost is per turn)",
    )
    p.add_argument("--time-scale", type=float, default=10.0, help="divide every field duration by this")
    p.add_argument(
        "--check-time-scale",
        type=float,
        default=3.0,
        help="the check's time scale: a pace the machine holds below saturation (0: --time-scale)",
    )
    p.add_argument("--warmup-s", type=float, default=45.0, help="before each window (about one episode at 1/10)")
    p.add_argument("--window-s", type=float, default=45.0, help="measured window per N")
    p.add_argument("--idle-s", type=float, default=15.0, help="measured window of the idle stack")
    p.add_argument("--utilisation", type=float, default=0.7, help="target utilisation of a core or a shard")
    p.add_argument("--replicas", default="", help="the seed's replicas, e.g. worker=4,proxy=2 (default k8s/base)")
    p.add_argument("--costs-from", type=Path, default=None, help="costs of an earlier run's JSON (no measuring)")
    p.add_argument("--workers", type=int, default=2, help="worker processes of the measured stack")
    p.add_argument("--proxy-workers", type=int, default=2)
    p.add_argument("--redis-url", default=None, help="default: an embedded server")
    p.add_argument("--json", type=Path, default=None)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        replicas = parse_replicas(args.replicas)
    except ValueError as e:
        print(f"rollout bench capacity: {e}")
        return 2
    load_before = os.getloadavg()
    if args.costs_from:
        costs, windows = Costs(**json.loads(args.costs_from.read_text())["costs"]), {}
    else:
        windows = measure(args)
        costs = costs_from(windows["idle"], windows["small"], windows.get("short"), workload_leases_per_turn(args))
    scales = [plan(costs, factor, args.utilisation, replicas) for factor in SCALE_FACTORS]
    check = check_against(costs, windows["check"], check_time_scale(args)) if "check" in windows else None
    report(args, costs, scales, check, windows, replicas, (load_before, os.getloadavg()))
    return 0


def measure(args: argparse.Namespace) -> dict[str, Window]:
    """The idle, small-N and check windows, in one stack."""
    root = Path(tempfile.mkdtemp(prefix="rollout-capacity-"))
    windows: dict[str, Window] = {}
    try:
        with redis_url_or_embedded(args.redis_url) as url:
            stack = fleet.start_fleet(fleet_args(args), root, url, max(args.in_flight, args.check_in_flight))
            try:
                print("measuring the idle stack ...", flush=True)
                windows["idle"] = measure_window(stack, 0, args.warmup_s, args.idle_s, "")
                print(f"measuring costs at N={args.in_flight} ...", flush=True)
                windows["small"] = measure_window(stack, args.in_flight, args.warmup_s, args.window_s, "cap-costs")
                if args.short_in_flight:
                    print(f"measuring the cost of a lease: N={args.short_in_flight} short episodes ...", flush=True)
                    windows["short"] = measure_window(stack, args.short_in_flight, args.warmup_s, args.window_s,
                                                      "cap-short", stack.short_classes)  # fmt: skip
                if args.check_in_flight:
                    print(f"checking at N={args.check_in_flight} ...", flush=True)
                    windows["check"] = measure_window(stack, args.check_in_flight, args.warmup_s, args.window_s,
                                                      "cap-check", stack.capacity_classes)  # fmt: skip
            finally:
                stack.stack.stop()
    finally:  # the broker keeps the sandboxes of leases still live when it stops: they go here
        remove_state_dir(root / "sandboxes")
        shutil.rmtree(root, ignore_errors=True)
    return windows


def fleet_args(args: argparse.Namespace) -> argparse.Namespace:
    """The fleet bench's defaults with this command's stack settings (no tail batch)."""
    parser = argparse.ArgumentParser()
    fleet.register(parser.add_subparsers())
    return parser.parse_args(["fleet", "--time-scale", str(args.time_scale), "--tail-batch", "0",
                              "--capacity-time-scale", str(check_time_scale(args)),  # the check's workload
                              "--workers", str(args.workers), "--proxy-workers", str(args.proxy_workers)])  # fmt: skip


def check_time_scale(args: argparse.Namespace) -> float:
    return float(args.check_time_scale or args.time_scale)


def workload_leases_per_turn(args: argparse.Namespace) -> float:
    """Leases per turn of the workload in steady state: one per episode, 1 / its mean turns."""
    shape = fleet_args(args)
    return 1 / workload.mean_turns(workload.sample_classes(shape.classes, shape.time_scale, shape.seed))


def costs_from(idle: Window, busy: Window, short: Window | None, steady_leases_per_turn: float) -> Costs:
    """Marginal costs: each busy window minus the idle one, split per turn and per lease
    (``per_turn_and_per_lease``); leases per turn are the workload's steady state."""
    if busy.turns <= 0:
        raise RuntimeError("no LLM turns in the measured window: lengthen --window-s")
    if short is not None and short.turns <= 0:
        raise RuntimeError("no LLM turns in the short episodes' window: lengthen --window-s")
    idle_cores, idle_ops = idle.cores, idle.commands / idle.seconds
    windows = [w for w in (busy, short) if w is not None]

    def split(rates: list[float]) -> tuple[float, float]:  # one rate per window, over the idle stack's
        rows = [(rate, w.turns_per_s, w.leases_per_s) for rate, w in zip(rates, windows, strict=True)]
        return per_turn_and_per_lease(rows[0], rows[1] if len(rows) > 1 else None)

    ms_turn, ms_lease = {}, {}
    for r in ROLES:
        per_turn, per_lease = split([w.cores[r] - idle_cores[r] for w in windows])
        ms_turn[r], ms_lease[r] = 1000 * per_turn, 1000 * per_lease
    ops_turn, ops_lease = split([w.commands / w.seconds - idle_ops for w in windows])
    return Costs(
        ms_per_turn=ms_turn,
        idle_cores=idle_cores,
        redis_ops_per_turn=ops_turn,
        redis_idle_ops_per_s=idle_ops,
        leases_per_turn=steady_leases_per_turn,
        shard_ops_per_s=shard_rate(idle, windows),
        ms_per_lease=ms_lease,
        redis_ops_per_lease=ops_lease,
    )


def shard_rate(idle: Window, busy: list[Window]) -> float:
    """What one Redis core serves of the platform's mix: marginal commands per marginal Redis CPU
    second over the busy windows (their average where the idle stack's share cannot be told apart)."""
    idle_ops, idle_redis = idle.commands / idle.seconds, idle.cores["redis"]
    extra_ops = sum(w.commands / w.seconds - idle_ops for w in busy)
    extra_redis = sum(w.cores["redis"] - idle_redis for w in busy)
    if extra_ops > 0 and extra_redis > 0:
        return extra_ops / extra_redis
    busy_redis = sum(w.cores["redis"] for w in busy)
    if busy_redis > 0:
        return sum(w.commands / w.seconds for w in busy) / busy_redis
    raise RuntimeError("Redis used no CPU in the measured window: lengthen --window-s")


def check_against(costs: Costs, measured: Window, time_scale: float) -> dict[str, Any]:
    """The costs' prediction of the check window's control-plane CPU, at its turn and lease rates."""
    predicted = costs.cores_used(measured.turns_per_s, leases_per_s=measured.leases_per_s)
    total, actual = sum(predicted.values()), measured.control_plane_cores
    return {
        "in_flight": measured.in_flight,
        "time_scale": time_scale,
        "turns_per_s": measured.turns_per_s,
        "leases_per_s": measured.leases_per_s,
        "predicted_cpu_cores": total,
        "measured_cpu_cores": actual,
        "ratio": total / actual if actual else None,
        "predicted_cores_by_role": predicted,
        "measured_cores_by_role": measured.cores,
    }


def report(
    args: argparse.Namespace,
    costs: Costs,
    scales: list[Scale],
    check: dict[str, Any] | None,
    windows: dict[str, Window],
    replicas: dict[str, int],
    load: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:
    print_table("measured costs (marginal CPU ms per turn and per lease, idle cores)", [
        {"role": r, "ms/turn": costs.ms_per_turn[r], "ms/lease": costs.ms_per_lease.get(r, 0.0),
         "idle cores": costs.idle_cores[r]} for r in ROLES
    ])  # fmt: skip
    steady = workload_leases_per_turn(args)
    measured = ", ".join(f"{name} {w.leases / w.turns:.4f}" for name, w in windows.items() if w.turns)
    measured = f" (measured: {measured})" if measured else ""
    print(f"Redis: {costs.redis_ops_per_turn:.2f} commands/turn and {costs.redis_ops_per_lease:.1f}/lease, "
          f"{costs.shard_ops_per_s:,.0f} commands/s per shard core; leases/turn: {costs.leases_per_turn:.4f} in "
          f"the model, {steady:.4f} the workload's steady state{measured}")  # fmt: skip
    if "small" in windows and windows["small"].turns:
        small = windows["small"]
        top = sorted(small.commands_by_name.items(), key=lambda kv: -kv[1])[:8]
        per_turn = ", ".join(f"{name} {calls / small.turns:.2f}" for name, calls in top)
        print(f"Redis commands per turn at N={small.in_flight}: {per_turn}")
    for s in scales:
        rows = [{"component": r, "cores needed": s.cores_by_role[r], "replicas": replicas.get(r, 0) * s.factor or 1,
                 "utilisation": s.utilisation_by_component[r]} for r in ROLES]  # fmt: skip
        print_table(f"{s.factor}x the seed: {s.engines} engines, {s.sandboxes} sandboxes, {s.turns_per_s:g} turns/s "
                    f"(target utilisation {args.utilisation:g})", rows)  # fmt: skip
        print(f"total {s.cores_total:.1f} cores; Redis {s.redis_ops_per_s:,.0f} ops/s -> {s.redis_shards} shard(s); "
              f"{s.leases_per_s:.1f} leases/s; first to saturate: {s.first_to_saturate}"
              f"{' (past the target)' if s.saturated else ''}")  # fmt: skip
    if check:
        print(f"\ncheck at N={check['in_flight']}, time scale 1/{check['time_scale']:g} "
              f"({check['turns_per_s']:.1f} turns/s, {check['leases_per_s']:.2f} leases/s): predicted "
              f"{check['predicted_cpu_cores']:.3f} cores, measured {check['measured_cpu_cores']:.3f}, "
              f"ratio {check['ratio']:.3f}")  # fmt: skip
    print(f"load average before {load[0][0]:.2f}, after {load[1][0]:.2f}")
    write_json(args.json, {
        "benchmark": "capacity",
        "time_scale": args.time_scale,
        "utilisation": args.utilisation,
        "seed": {"engines": SEED_ENGINES, "sandboxes": SEED_SANDBOXES, "turns_per_s": SEED_TURNS_PER_S},
        "seed_replicas": replicas,
        "costs": dataclasses.asdict(costs),
        "windows": {name: w.as_json() for name, w in windows.items()},
        "scales": [dataclasses.asdict(s) for s in scales],
        "check": check,
        "workload_leases_per_turn": steady,  # 1 / mean turns: costs measured far from it are not steady
        "load_average": {"before": load[0][0], "after": load[1][0]},
    })  # fmt: skip

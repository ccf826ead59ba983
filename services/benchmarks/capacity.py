"""``rollout bench capacity``: the cores, Redis operations per second and Redis Cluster shards the
seed's fleet (24 engines, 384 sandboxes, about 75 turns/s) needs, and 10x and 100x of it.

Costs are measured in the same run, on the fleet bench's stack (``fleet.start_fleet``): a window of
the idle stack, then a window at a small N in flight give each role's idle CPU and marginal CPU per
LLM turn, Redis commands per turn (INFO commandstats), sandbox leases per turn, and what one Redis
core serves of this command mix (marginal commands per marginal Redis CPU second). The model is in
``capacity_model``. The check runs the largest N this machine holds (``--check-in-flight``) in the
same stack and compares the control-plane CPU the small-N costs predict at its measured turn rate
with the CPU it measured.
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
    p.add_argument("--time-scale", type=float, default=10.0, help="divide every field duration by this")
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
        costs = costs_from(windows["idle"], windows["small"])
    scales = [plan(costs, factor, args.utilisation, replicas) for factor in SCALE_FACTORS]
    check = check_against(costs, windows["check"]) if "check" in windows else None
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
                if args.check_in_flight:
                    print(f"checking at N={args.check_in_flight} ...", flush=True)
                    windows["check"] = measure_window(stack, args.check_in_flight, args.warmup_s, args.window_s,
                                                      "cap-check")  # fmt: skip
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
                              "--workers", str(args.workers), "--proxy-workers", str(args.proxy_workers)])  # fmt: skip


def workload_leases_per_turn(args: argparse.Namespace) -> float:
    """Leases per turn of the workload in steady state: one per episode, 1 / its mean turns."""
    shape = fleet_args(args)
    return 1 / workload.mean_turns(workload.sample_classes(shape.classes, shape.time_scale, shape.seed))


def costs_from(idle: Window, busy: Window) -> Costs:
    """Marginal costs: the busy window minus the idle one, per turn of the busy window."""
    if busy.turns <= 0:
        raise RuntimeError("no LLM turns in the measured window: lengthen --window-s")
    turns_s = busy.turns_per_s
    idle_cores, busy_cores = idle.cores, busy.cores
    ms = {r: max(0.0, busy_cores[r] - idle_cores[r]) * 1000 / turns_s for r in ROLES}
    idle_ops, busy_ops = idle.commands / idle.seconds, busy.commands / busy.seconds
    extra_ops, extra_redis = busy_ops - idle_ops, busy_cores["redis"] - idle_cores["redis"]
    if extra_ops > 0 and extra_redis > 0:
        shard = extra_ops / extra_redis
    elif busy_cores["redis"] > 0:  # too short to tell the idle stack's share apart: the average
        shard = busy_ops / busy_cores["redis"]
    else:
        raise RuntimeError("Redis used no CPU in the measured window: lengthen --window-s")
    return Costs(
        ms_per_turn=ms,
        idle_cores=idle_cores,
        redis_ops_per_turn=max(0.0, extra_ops) / turns_s,
        redis_idle_ops_per_s=idle_ops,
        leases_per_turn=busy.leases / busy.turns,
        shard_ops_per_s=shard,
    )


def check_against(costs: Costs, measured: Window) -> dict[str, Any]:
    """The small-N costs' prediction of the check window's control-plane CPU, at its turn rate."""
    predicted = costs.cores_used(measured.turns_per_s)
    total, actual = sum(predicted.values()), measured.control_plane_cores
    return {
        "in_flight": measured.in_flight,
        "turns_per_s": measured.turns_per_s,
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
    print_table("measured costs (marginal CPU ms per turn, idle cores)", [
        {"role": r, "ms/turn": costs.ms_per_turn[r], "idle cores": costs.idle_cores[r]} for r in ROLES
    ])  # fmt: skip
    steady = workload_leases_per_turn(args)
    print(f"Redis: {costs.redis_ops_per_turn:.2f} commands/turn, {costs.shard_ops_per_s:,.0f} commands/s per shard "
          f"core; {costs.leases_per_turn:.4f} leases/turn (the workload's steady state: {steady:.4f})")  # fmt: skip
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
        print(f"\ncheck at N={check['in_flight']} ({check['turns_per_s']:.1f} turns/s): predicted "
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

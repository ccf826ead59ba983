"""``rollout bench proxy``: the same load directly against the engines, through our proxy, and
through the Rust sglang-router, all against the same simulated engines in one run.

Figures: added latency (p50/p99 through a router minus direct), throughput ratios, errors, the
proxy's CPU seconds. Optionally a weight-update transaction runs while the proxy phase is at
full concurrency. ``--proxy-url`` (and ``--engine-urls``) point the same load at an existing
deployment, with a concurrency ramp (``--ramp``) that reports where errors or latency climb.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from services.benchmarks.proxy_fleet import ADMIN_HEADERS, Launched, start_engines, start_proxy, start_router, stopping
from services.benchmarks.proxy_load import LoadResult, LoadSpec, run_in_process
from services.benchmarks.report import percentile, write_json
from services.runtime.tables import print_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("proxy", help="LLM proxy load: direct vs our proxy vs sglang-router")
    p.add_argument("--engines", type=int, default=24, help="simulated engines (default 24)")
    p.add_argument("--engine-processes", type=int, default=2, help="processes serving them (default 2)")
    p.add_argument("--concurrency", type=int, default=2000, help="calls in flight (default 2000)")
    p.add_argument("--requests", type=int, default=None, help="calls per phase (default 3 x concurrency)")
    p.add_argument("--workers", type=int, default=2, help="proxy processes (default 2)")
    p.add_argument("--call-seconds", type=float, default=4.0, help="engine time of one call under load (4)")
    p.add_argument("--output-tokens", type=int, default=100, help="mean answer length (100)")
    p.add_argument("--prompt-min", type=int, default=1024)
    p.add_argument("--prompt-max", type=int, default=64_000)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=1, help="rounds of the three phases, order rotated (1)")
    p.add_argument("--no-router", action="store_true", help="skip the sglang-router phase")
    p.add_argument("--weight-update", action="store_true", help="run a weight update mid proxy phase")
    p.add_argument("--proxy-url", default=None, help="load an existing proxy instead of starting one")
    p.add_argument("--engine-urls", default=None, help="existing engines (comma-separated) for the direct baseline")
    p.add_argument("--pool", default=None, help="X-Pool for an existing proxy")
    p.add_argument("--ramp", default=None, help="concurrency steps for an existing proxy, e.g. 100,500,1000")
    p.add_argument("--log-dir", type=Path, default=None, help="process logs (default: a temporary directory)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--replay", type=Path, default=None,
                   help="replay this dump's LLM calls (rollout trajectories export) against --proxy-url")  # fmt: skip
    p.add_argument("--time-scale", type=float, default=1.0, help="--replay: recorded pacing divided by this (1)")
    p.add_argument("--sessions", type=int, default=None, help="--replay: only the first N trajectories")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.replay:
        return run_replay(args)
    if args.proxy_url:
        return run_external(args)
    requests = args.requests or 3 * args.concurrency
    per_engine = args.concurrency / args.engines
    step_per_request = 2e-4
    decode_step = max(0.001, args.call_seconds / args.output_tokens - step_per_request * per_engine)
    engine_args = [
        "--decode-step-s", f"{decode_step:.5f}", "--decode-step-per-request-s", str(step_per_request),
        "--output-tokens", str(args.output_tokens), "--kv-capacity-tokens", "100000000",
        "--prefix-cache-entries", "8", "--max-running-requests", str(max(256, 4 * int(per_engine))),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        logs = args.log_dir or Path(tmp)
        engines, urls = start_engines(args.engines, args.engine_processes, engine_args, logs)
        with stopping(engines) as launched:
            proxy = start_proxy(urls, args.workers, logs)
            launched.append(proxy)
            router = None if args.no_router else start_router(urls, logs)
            if router is not None:
                launched.append(router)
            figures = measure(args, requests, urls, proxy, router, Path(tmp))
    print_table(
        f"proxy benchmark: {args.engines} engines, {args.concurrency} in flight, {requests} calls", figures["rows"]
    )
    write_json(args.json, figures)
    return 0


def _spec(args: argparse.Namespace, targets: list[str], concurrency: int, requests: int) -> LoadSpec:
    headers = (("X-Pool", args.pool),) if args.pool else ()
    return LoadSpec(tuple(targets), concurrency, requests, args.prompt_min, args.prompt_max, args.max_new_tokens,
                    headers)  # fmt: skip


def _row(name: str, result: LoadResult, cpu_s: float | None) -> dict[str, Any]:
    lat = result.latencies_s
    return {
        "target": name,
        "ok": len(lat),
        "errors": sum(result.errors.values()),
        "p50_s": percentile(lat, 50),
        "p99_s": percentile(lat, 99),
        "calls_per_s": result.throughput,
        "wall_s": result.wall_s,
        "cpu_s": cpu_s,
    }


def _added_ms(result: LoadResult, direct: LoadResult, q: float) -> float:
    return 1000 * (percentile(result.latencies_s, q) - percentile(direct.latencies_s, q))


def _phase(spec: LoadSpec, process: Launched | None) -> tuple[LoadResult, float | None]:
    before = process.cpu_s() if process else 0.0
    result = run_in_process(spec)
    return result, (process.cpu_s() - before) if process else None


def measure(
    args: argparse.Namespace, requests: int, urls: list[str], proxy: Launched, router: Launched | None, tmp: Path
) -> dict[str, Any]:
    """Warm up, then ``--rounds`` rounds of direct / proxy / router, the order rotated every round so
    that load from other work on the host falls on every target alike; calls are pooled per target."""
    load_avg_1m = os.getloadavg()[0]
    idle = _idle_cpu_ms_per_s([proxy] if router is None else [proxy, router])
    run_in_process(_spec(args, urls, args.concurrency, args.concurrency))  # warm-up, not measured
    targets: list[tuple[str, list[str], Launched | None]] = [("direct", urls, None), ("our proxy", [proxy.url], proxy)]
    if router is not None:
        targets.append(("sglang-router", [router.url], router))
    pooled: dict[str, LoadResult] = {name: LoadResult() for name, _, _ in targets}
    cpu: dict[str, float] = dict.fromkeys(pooled, 0.0)
    update: dict[str, Any] = {}
    for r in range(args.rounds):
        for name, target_urls, process in targets[r % len(targets) :] + targets[: r % len(targets)]:
            spec = _spec(args, target_urls, args.concurrency, requests)
            if name == "our proxy" and args.weight_update and r == 0:
                result, used = _phase_with_update(args, spec, proxy, tmp, update)
            else:
                result, used = _phase(spec, process)
            pooled[name].merge(result)
            cpu[name] += used or 0.0
    direct, ours = pooled["direct"], pooled["our proxy"]
    rows = [_row(name, pooled[name], cpu[name] if process else None) for name, _, process in targets]
    figures: dict[str, Any] = {
        "engines": args.engines, "concurrency": args.concurrency, "requests": requests, "workers": args.workers,
        "rounds": args.rounds, "prompt_tokens": [args.prompt_min, args.prompt_max], "call_seconds": args.call_seconds,
        "errors": sum(ours.errors.values()), "error_kinds": dict(ours.errors),
        "direct_errors": sum(direct.errors.values()),
        "added_latency_p50_ms": _added_ms(ours, direct, 50), "added_latency_p99_ms": _added_ms(ours, direct, 99),
        "throughput_ratio_vs_direct": _ratio(ours, direct), "proxy_cpu_s": cpu["our proxy"],
        "cpu_ms_per_call": _per_call_ms(cpu["our proxy"], ours), "proxy_idle_cpu_ms_per_s": idle[0],
        "load_avg_1m_at_start": load_avg_1m,
    }  # fmt: skip
    if router is not None:
        theirs = pooled["sglang-router"]
        figures |= {
            "router_errors": sum(theirs.errors.values()),
            "router_added_latency_p50_ms": _added_ms(theirs, direct, 50),
            "router_added_latency_p99_ms": _added_ms(theirs, direct, 99),
            "throughput_ratio_vs_router": _ratio(ours, theirs), "router_cpu_s": cpu["sglang-router"],
            "router_cpu_ms_per_call": _per_call_ms(cpu["sglang-router"], theirs), "router_idle_cpu_ms_per_s": idle[1],
        }  # fmt: skip
    if update:
        figures["weight_update"] = update
    figures["rows"] = rows
    return figures


def _idle_cpu_ms_per_s(processes: list[Launched], seconds: float = 3.0) -> list[float]:
    """Each router's background CPU (health probes, membership sync, metrics) in ms per second, with
    no calls: a phase's CPU includes it for its whole wall time, so at low call rates (long calls,
    few in flight) it is a large share of ``cpu_ms_per_call``."""
    before = [p.cpu_s() for p in processes]
    time.sleep(seconds)
    return [1000 * (p.cpu_s() - b) / seconds for p, b in zip(processes, before, strict=True)]


def _per_call_ms(cpu_s: float, result: LoadResult) -> float | None:
    """A router's CPU (its process tree's, over its phases) per call it was sent, answered or not."""
    calls = len(result.latencies_s) + sum(result.errors.values())
    return 1000 * cpu_s / calls if calls else None


def _ratio(a: LoadResult, b: LoadResult) -> float | None:
    return a.throughput / b.throughput if b.throughput else None


def _phase_with_update(
    args: argparse.Namespace, spec: LoadSpec, proxy: Launched, tmp: Path, out: dict[str, Any]
) -> tuple[LoadResult, float | None]:
    """The proxy phase with a weight update posted once the calls are in flight."""
    weights = tmp / "weights-bench-v1"
    weights.mkdir(exist_ok=True)
    box: list[tuple[LoadResult, float | None]] = []
    load = threading.Thread(target=lambda: box.append(_phase(spec, proxy)))
    load.start()
    time.sleep(max(2.0, args.call_seconds))  # the calls are in flight by now
    body = {"pool": "default", "version": "bench-v1", "location": str(weights), "checksum": "sha256:bench"}
    resp = httpx.post(proxy.url + "/admin/weights", json=body, timeout=600, headers=ADMIN_HEADERS)
    verdict = resp.json()
    out |= {"status": resp.status_code, "ok": verdict.get("ok"), "total_s": verdict.get("total_s"),
            "held_calls": verdict.get("held_calls"), "held_s": verdict.get("held_s"),
            "quarantined": verdict.get("quarantined")}  # fmt: skip
    load.join()
    return box[0]


def run_external(args: argparse.Namespace) -> int:
    """Load an existing proxy (and optionally its engines directly) over a concurrency ramp."""
    steps = [int(s) for s in (args.ramp or str(args.concurrency)).split(",")]
    engine_urls = [u.strip() for u in (args.engine_urls or "").split(",") if u.strip()]
    rows, knee = [], None
    for c in steps:
        requests = args.requests or 3 * c
        ours = run_in_process(_spec(args, [args.proxy_url], c, requests))
        row = _row(f"proxy c={c}", ours, None)
        if engine_urls:
            direct = run_in_process(_spec(args, engine_urls, c, requests))
            row["added_p50_ms"] = 1000 * (row["p50_s"] - percentile(direct.latencies_s, 50))
            row["added_p99_ms"] = 1000 * (row["p99_s"] - percentile(direct.latencies_s, 99))
        rows.append(row)
        if knee is None and (row["errors"] or (len(rows) > 1 and row["p99_s"] > 2 * rows[0]["p99_s"])):
            knee = c
    print_table(f"proxy ramp against {args.proxy_url}", rows)
    write_json(args.json, {"rows": rows, "knee_concurrency": knee, "errors": sum(r["errors"] for r in rows)})
    return 0


def run_replay(args: argparse.Namespace) -> int:
    from services.benchmarks.replay import replay_dump

    if not args.proxy_url or args.time_scale <= 0:
        raise SystemExit("--replay needs --proxy-url and a positive --time-scale")
    figures = replay_dump(args.replay, args.proxy_url, scale=args.time_scale, pool=args.pool, limit=args.sessions)
    row = {k: figures[k] for k in ("sessions", "calls", "errors", "latency_p50_s", "latency_p99_s", "affinity",
                                   "start_lateness_p99_s", "wall_s")}  # fmt: skip
    print_table(f"replay of {args.replay} against {args.proxy_url} at {args.time_scale}x", [row])
    write_json(args.json, figures)
    return 0

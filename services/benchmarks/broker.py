"""``rollout bench broker``: L concurrent leases, each running a few commands, then released.

Phases, in one run against one broker process: cold leases (resources unlike the warm pool's),
warm leases (taken from a pool of L, all at once, asked for through the worker's own client and its
coalescer: ``warm_lease_*``; the same burst with a request per lease over connections opened first:
``warm_lease_single_*``; the same leases in one ``POST /leases/batch``: ``warm_lease_batch_*``; beside
them ``burst_floor_*``, a request each to a server that does nothing: ``http_floor.py``), the exec overhead (the same
command through the broker and directly on the bare backend, sequentially), the same L warm
episodes started one at a time at ``--paced-rate`` per second (``warm_lease_paced_*``), on local
the time from a lease to its agent's first gateway call with a bundle mounted (``agent_start_*``,
``broker_agent.py``), then a kill -9 of the broker while leases are held and commands are running,
a restart, and a count of sandboxes left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from services.benchmarks import http_floor
from services.benchmarks.broker_agent import agent_starts, write_bundle
from services.benchmarks.broker_load import (
    Load,
    Outcome,
    leftover_processes,
    leftover_sandboxes,
    run_batched,
    run_leases,
    run_open,
    run_paced,
    run_worker,
)
from services.benchmarks.broker_phases import one_at_a_time
from services.benchmarks.broker_procs import Proc, python_proc
from services.benchmarks.cpuacct import CpuGroup
from services.benchmarks.procstat import processes, reference_cpu_ms, session_cpu_s, settle, tree_total_cpu_s
from services.benchmarks.report import percentile, write_json
from services.protocol.sandboxes import Resources, Template
from services.rollout_api.settings import WorkerSettings
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.secrets import FleetSecrets
from services.runtime.tables import print_table
from services.sandbox_broker.backends.leftovers import remove_sandboxes
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template

DEFAULT_SETUP = "python3 -c 'import json, sqlite3' && mkdir -p repo"  # a template that does a little work
COLD = {"cpus": 0.5, "memory_mb": 1024, "disk_mb": 2048}  # unlike the pool's: always a cold start


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("broker", help="sandbox broker: warm vs cold lease latency, exec overhead, kill -9 recovery")
    p.add_argument("--backend", choices=("local", "docker", "e2b"), default="local")
    p.add_argument("--isolation", choices=("namespaces", "gvisor"), default=None,
                   help="the sandboxes' isolation level (default: the backend's own; local: namespaces)")  # fmt: skip
    p.add_argument("--leases", type=int, default=100, help="concurrent leases (default 100)")
    p.add_argument("--commands", type=int, default=3, help="commands per lease (default 3)")
    p.add_argument("--egress-leases", type=int, default=None,
                   help="concurrent cold leases with egress (own netns, NAT, rules); default: --leases")  # fmt: skip
    p.add_argument("--exec-samples", type=int, default=100, help="sequential execs for the overhead figure")
    p.add_argument("--paced-rate", type=float, default=10.0,
                   help="warm leases per second in the paced phase (--leases of them, one at a time at this rate; "
                        "0 skips it)")  # fmt: skip
    p.add_argument("--agent-starts", type=int, default=20,
                   help="local: episodes (one at a time) timed from lease to the agent's first gateway call, "
                        "at most --leases (default 20; 0 skips it)")  # fmt: skip
    p.add_argument("--setup", action="append", default=None,
                   help="setup command of the benchmark's template, run at every cold start (repeatable; "
                        "default: one python3 start)")  # fmt: skip
    p.add_argument("--create-rounds", type=int, default=3,
                   help="bursts of bare cold leases whose median is cold_create_cpu_ms (default 3)")  # fmt: skip
    p.add_argument("--settle-timeout-s", type=float, default=30.0,
                   help="wait up to this long for a quiet host before each warm burst (default 30)")  # fmt: skip
    p.add_argument("--redis-url", default=None, help="default: an embedded server")
    p.add_argument("--docker-host", default=None, help="docker backend: the engine socket (unix://...)")
    p.add_argument("--docker-image", default=None, help="docker backend: a prepared image")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--log-dir", type=Path, default=None, help="keep the broker's log here (default: discarded)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    args.setup = args.setup if args.setup is not None else [DEFAULT_SETUP]
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-broker-") as tmp,
        redis_url_or_embedded(args.redis_url) as url,
    ):
        root = Path(tmp)
        root.chmod(0o711)
        try:
            figures = asyncio.run(_bench(args, url, root))
        finally:  # also after a failure: mounted sandboxes would keep the directory from going
            if args.backend == "local":
                remove_sandboxes(root / "state")
    _report(args, figures)
    return 0 if figures["errors"] == 0 and figures["leaked"] == 0 else 1


def _broker_env(args: argparse.Namespace, root: Path, fake: Proc | None) -> dict[str, str]:
    env = {"ROLLOUT_BROKER_STATE_DIR": str(root / "state"), "ROLLOUT_BROKER_INSTANCE": "bench",
           "ROLLOUT_BROKER_REAP_INTERVAL_S": "1", "ROLLOUT_BROKER_ORPHAN_INTERVAL_S": "5"}  # fmt: skip
    if args.backend == "local":
        write_bundle(root / "agents")
        env["ROLLOUT_BROKER_AGENTS_DIR"] = str(root / "agents")
    if args.docker_host:
        env["ROLLOUT_BROKER_DOCKER_HOST"] = args.docker_host
    if args.docker_image:
        env["ROLLOUT_BROKER_DOCKER_IMAGE"] = args.docker_image
    if fake is not None:
        env.update({"ROLLOUT_BROKER_E2B_API_URL": fake.url, "ROLLOUT_BROKER_E2B_SANDBOX_URL": fake.url,
                    "ROLLOUT_BROKER_E2B_API_KEY": "bench", "ROLLOUT_BROKER_E2B_WORKDIR": "/workspace",
                    "ROLLOUT_BROKER_E2B_MAX_SANDBOXES": str(4 * args.leases + 10)})  # fmt: skip
    return env


async def _bench(args: argparse.Namespace, redis_url: str, root: Path) -> dict[str, Any]:
    fake = None
    if args.backend == "e2b":
        (root / "e2b").mkdir(mode=0o711)
        fake = python_proc(["-m", "services.sandbox_broker.fakes.e2b", "--port", "{port}", "--state-dir",
                            str(root / "e2b"), "--max-concurrent", str(4 * args.leases + 10)],
                           {}, root / "fake-e2b.log", health="/_fake/stats")  # fmt: skip
        fake.start()
    secrets = FleetSecrets.generate()  # measured with authentication on, as deployed
    env = {**_broker_env(args, root, fake), **secrets.env()}
    argv = ["-m", "services.cli", "broker", "--port", "{port}", "--backend", args.backend, "--redis-url", redis_url,
            "--warm-pool", "0"]  # fmt: skip
    log_dir = args.log_dir or root
    log_dir.mkdir(parents=True, exist_ok=True)
    broker = python_proc(argv, env, log_dir / "broker.log")
    broker.cpu_group = CpuGroup.make("broker")
    fields = {k.removeprefix("ROLLOUT_BROKER_").lower(): v for k, v in env.items() if k.startswith("ROLLOUT_BROKER_")}
    settings = BrokerSettings.model_validate({**fields, "backend": args.backend, "redis_url": redis_url})
    started = time.monotonic()
    try:
        broker.start(timeout_s=120)
        load = Load(broker.url, args.commands, secrets)
        try:
            figures = await _phases(args, load, broker, settings)
        finally:
            await load.close()
    finally:
        broker.stop()
        if broker.cpu_group is not None:
            broker.cpu_group.remove()
    figures["leaked_sandboxes"] = await leftover_sandboxes(settings)
    figures["leaked_processes"] = await leftover_processes(str(settings.state_dir))
    figures["leaked"] = figures["leaked_sandboxes"] + len(figures["leaked_processes"])
    # the same burst against a server that does nothing: what the machine's HTTP alone costs
    figures.update(await http_floor.measure(args.leases, 3, log_dir / "floor.log"))
    figures["wall_s"] = time.monotonic() - started
    if fake is not None:
        fake.stop()
    return figures


async def _phases(args: argparse.Namespace, load: Load, broker: Proc, settings: BrokerSettings) -> dict[str, Any]:
    image = default_template(settings).image  # docker and e2b templates name an image
    template = {"name": "bench", "setup": args.setup, "warm_pool": args.leases, "image": image,
                "isolation": args.isolation}  # fmt: skip
    pool_timeout_s = max(600.0, 4.0 * args.leases)  # refills run 4 creates at a time; a loaded machine is slow
    await load.register(template, timeout_s=pool_timeout_s)
    cold, cold_cpu_ms = await _cold_burst(load, broker, args.leases, {"template": "bench", "resources": COLD})
    egress_n = args.leases if args.egress_leases is None else args.egress_leases
    egress_body = {"template": "bench", "resources": COLD, "network": "egress"}
    egress, egress_cpu_ms = await _cold_burst(load, broker, egress_n, egress_body)
    created = await _creation_alone(args, load, broker, image, egress_n)
    await load.wait_pool(args.leases, timeout_s=pool_timeout_s)
    settled = {"warm": await settle(timeout_s=args.settle_timeout_s)}  # the cold bursts' teardown goes on
    cpu_before = _own_cpu_s(broker)  # the worker's path: its client's coalescer, batches of what is asked at once
    warm = await run_worker(
        load, args.leases, {"template": "bench"}, WorkerSettings().lease_batch_window_s, settings.redis_url
    )  # as a worker does: claimed from Redis, the rest in batches
    warm_cpu_ms = (_own_cpu_s(broker) - cpu_before) * 1000 / max(len(warm.start_ms), 1)
    await load.wait_pool(args.leases, timeout_s=pool_timeout_s)
    settled["single"] = await settle(timeout_s=args.settle_timeout_s)
    cpu_before = _own_cpu_s(broker)
    single = await run_open(load, args.leases, {"template": "bench"})  # the same leases, one request each
    single_cpu_ms = (_own_cpu_s(broker) - cpu_before) * 1000 / max(len(single.start_ms), 1)
    await load.wait_pool(args.leases, timeout_s=pool_timeout_s)
    settled["batch"] = await settle(timeout_s=args.settle_timeout_s)
    cpu_before = _own_cpu_s(broker)
    batched = await run_batched(load, args.leases, {"template": "bench"})  # the same leases, one request
    batched_cpu_ms = (_own_cpu_s(broker) - cpu_before) * 1000 / max(len(batched.start_ms), 1)
    await load.wait_pool(args.leases, timeout_s=pool_timeout_s)  # refills done: measure the exec path alone
    cpu_before = _broker_cpu_s(broker)
    via_broker, direct = await load.overhead(settings, args.exec_samples, args.isolation)
    broker_cpu_ms = (_broker_cpu_s(broker) - cpu_before) * 1000 / max(len(via_broker), 1)
    # after the overhead: the paced lease rate raises the pool's target, and its refills would run during it
    paced = await _paced(args, load)
    alone = await _one_at_a_time(args, load, settings)
    starts = await _agent_starts(args, load, pool_timeout_s)
    template["warm_pool"] = 0  # the restarted broker need not refill it
    await load.register(template, timeout_s=60)
    recovery = await _kill9_and_restart(load, broker, min(args.leases, 50))
    return {
        "backend": args.backend, "isolation": args.isolation or "default", "leases": args.leases,
        "commands_per_lease": args.commands,
        "cold_lease_p50_ms": percentile(cold.start_ms, 50), "cold_lease_p99_ms": percentile(cold.start_ms, 99),
        # the broker's and its children's CPU (sandbox processes, agents, commands) per cold lease: the
        # template's setup, the episode's commands and the release included; then the same with egress
        "cold_lease_cpu_ms": cold_cpu_ms, "egress_cold_lease_cpu_ms": egress_cpu_ms, **created,
        "cold_task_cpu_ms": cold_cpu_ms - created["cold_create_cpu_ms"],  # the setup's and the episode's
        "egress_cold_task_cpu_ms": egress_cpu_ms - created["egress_cold_create_cpu_ms"],
        "cold_create_cpu_source": "cpuacct" if broker.cpu_group else "tree", **alone,
        # L episodes asking at once through the worker's BrokerClient (claims straight from Redis, then its
        # coalescer: POST /leases/batch), and how many it claimed with no broker request
        "warm_lease_p50_ms": percentile(warm.start_ms, 50), "warm_lease_p99_ms": percentile(warm.start_ms, 99),
        "warm_lease_batches": warm.batches, "warm_lease_claimed": warm.claimed,
        # before each warm burst, how long the host took to go quiet and how busy its cores were then
        "settle_s": {k: round(v[0], 2) for k, v in settled.items()},
        "settle_host_busy": {k: round(v[1], 3) for k, v in settled.items()},
        # the same burst with one POST /leases per lease, over connections opened before it
        "warm_lease_single_p50_ms": percentile(single.start_ms, 50),
        "warm_lease_single_p99_ms": percentile(single.start_ms, 99), "single_warm_hits": single.warm,
        "egress_leases": egress_n,
        "egress_cold_lease_p50_ms": percentile(egress.start_ms, 50),
        "egress_cold_lease_p99_ms": percentile(egress.start_ms, 99),
        "egress_exec_under_load_p50_ms": percentile(egress.exec_ms, 50),
        "warm_hits": warm.warm, "cold_hits": cold.warm,
        # the same burst asked for in one POST /leases/batch; each lease timed to the batch's answer
        "warm_lease_batch_p50_ms": percentile(batched.start_ms, 50),
        "warm_lease_batch_p99_ms": percentile(batched.start_ms, 99), "batch_warm_hits": batched.warm,
        # the broker process's own CPU per lease over each burst's episodes (leases, commands, releases and
        # the pool refills that start meanwhile)
        "warm_episode_broker_cpu_ms": warm_cpu_ms, "single_episode_broker_cpu_ms": single_cpu_ms,
        "batch_episode_broker_cpu_ms": batched_cpu_ms,
        # the same warm episodes, started one at a time at --paced-rate per second instead of all at once
        "paced_rate_per_s": args.paced_rate, "paced_leases": len(paced.start_ms) + paced.errors,
        "warm_lease_paced_p50_ms": percentile(paced.start_ms, 50),
        "warm_lease_paced_p99_ms": percentile(paced.start_ms, 99), "paced_warm_hits": paced.warm,
        # local: lease asked for -> the first gateway call of an agent from a mounted bundle, one at a time
        "agent_starts": len(starts.start_ms), "agent_start_warm_hits": starts.warm,
        "agent_start_p50_ms": percentile(starts.start_ms, 50), "agent_start_p99_ms": percentile(starts.start_ms, 99),
        "exec_under_load_p50_ms": percentile(warm.exec_ms, 50), "exec_under_load_p99_ms": percentile(warm.exec_ms, 99),
        "exec_broker_p50_ms": percentile(via_broker, 50), "exec_direct_p50_ms": percentile(direct, 50),
        "exec_overhead_p50_ms": percentile([b - d for b, d in zip(via_broker, direct, strict=True)], 50),
        "broker_cpu_ms_per_exec": broker_cpu_ms,
        "errors": cold.errors + egress.errors + created["bare_errors"] + warm.errors + single.errors + batched.errors
        + paced.errors + starts.errors + recovery["errors_after_restart"],
        "error_samples": cold.samples + egress.samples + created["bare_error_samples"] + warm.samples
        + single.samples + batched.samples + paced.samples + starts.samples,
        **recovery,
    }  # fmt: skip


async def _cold_burst(load: Load, broker: Proc, n: int, body: dict[str, Any]) -> tuple[Outcome, float]:
    """``n`` cold leases at once, and the CPU of the broker and its children per lease made."""
    cpu_before = _tree_cpu_s(broker)
    outcome = await run_leases(load, n, body)
    return outcome, (_tree_cpu_s(broker) - cpu_before) * 1000 / max(len(outcome.start_ms), 1)


async def _creation_alone(args: argparse.Namespace, load: Load, broker: Proc, image: str | None,
                          egress_n: int) -> dict[str, Any]:  # fmt: skip
    """The cold bursts again with a template without setup, each lease released at once: a cold
    sandbox's creation and release alone (``cold_create_cpu_ms``), the task's work left out."""
    await load.register({"name": "bench-bare", "setup": [], "warm_pool": 0, "image": image,
                         "isolation": args.isolation},
                        timeout_s=60)  # fmt: skip
    commands, load.commands = load.commands, 0
    bare, rounds, references = Outcome(), [], []
    try:
        for _ in range(max(args.create_rounds, 1)):  # the median of a few: this host's speed drifts
            references.append(round(reference_cpu_ms(), 1))
            burst, cpu_ms = await _cold_burst(load, broker, args.leases, {"template": "bench-bare", "resources": COLD})
            rounds.append(round(cpu_ms, 2))
            bare.start_ms += burst.start_ms
            bare.errors, bare.samples = bare.errors + burst.errors, bare.samples + burst.samples
        body = {"template": "bench-bare", "resources": COLD, "network": "egress"}
        egress, egress_cpu_ms = await _cold_burst(load, broker, egress_n, body)
    finally:
        load.commands = commands
    return {"cold_create_cpu_ms": statistics.median(rounds), "cold_create_cpu_ms_rounds": rounds,
            "cpu_reference_ms": references, "egress_cold_create_cpu_ms": egress_cpu_ms,
            "bare_cold_lease_p50_ms": percentile(bare.start_ms, 50),
            "bare_cold_lease_p99_ms": percentile(bare.start_ms, 99), "bare_errors": bare.errors + egress.errors,
            "bare_error_samples": bare.samples + egress.samples}  # fmt: skip


async def _paced(args: argparse.Namespace, load: Load) -> Outcome:
    if args.paced_rate <= 0:
        return Outcome()
    return await run_paced(load, args.leases, args.paced_rate, {"template": "bench"})


async def _agent_starts(args: argparse.Namespace, load: Load, pool_timeout_s: float) -> Outcome:
    n = min(args.agent_starts, args.leases) if args.backend == "local" else 0
    if n <= 0:
        return Outcome()
    await load.wait_pool(n, timeout_s=pool_timeout_s)  # warm leases, as an episode usually gets
    return await agent_starts(load, n, {"template": "bench"})


async def _one_at_a_time(args: argparse.Namespace, load: Load, settings: BrokerSettings) -> dict[str, Any]:
    """local: one cold sandbox's creation phase by phase, in this process (broker_phases.py)."""
    if args.backend != "local":
        return {}
    lease = await load.create({"template": "bench"})  # its id labels the sandboxes: the reaper spares them
    assert lease is not None, "could not lease a sandbox"
    try:
        template = Template(name="bench", setup=args.setup, isolation=args.isolation)
        return await one_at_a_time(settings, template, Resources.model_validate(COLD), lease["id"])
    finally:
        await load.release(lease["id"])


def _tree_cpu_s(broker: Proc) -> float:
    """CPU seconds of the broker and every process it started: its cpuacct group's, else (no writable
    cgroup v1) its live process tree's with what each waited for (which misses orphaned sandbox processes)."""
    if broker.cpu_group is not None:
        return broker.cpu_group.cpu_s()
    assert broker.proc is not None
    return tree_total_cpu_s(broker.proc.pid)


def _own_cpu_s(broker: Proc) -> float:
    """CPU seconds of the broker process alone (not its children)."""
    assert broker.proc is not None
    return next((p.own_s for p in processes() if p.pid == broker.proc.pid), 0.0)


def _broker_cpu_s(broker: Proc) -> float:
    """CPU seconds of the broker's session: the broker, and the commands it ran and reaped itself (a
    bubblewrap per command without exec agents; the agents have sessions of their own)."""
    assert broker.proc is not None
    return session_cpu_s({broker.proc.pid: "broker"})["broker"]


async def _kill9_and_restart(load: Load, broker: Proc, n: int) -> dict[str, Any]:
    """Hold n leases, kill -9 the broker while commands run in them, restart it, finish the leases."""
    held = [lease for lease in await asyncio.gather(*(load.create({"template": "bench"}) for _ in range(n))) if lease]
    running = [asyncio.create_task(load.exec(lease["id"], "sleep 2")) for lease in held]
    await asyncio.sleep(0.5)
    broker.kill9()
    interrupted = sum(1 for r in await asyncio.gather(*running, return_exceptions=True) if not isinstance(r, float))
    broker.start(timeout_s=120)
    await load.reconnect()  # pooled connections died with the old process
    errors = 0
    for lease in held:
        with contextlib.suppress(Exception):
            if await load.exec(lease["id"], "true") is None:
                errors += 1
        if not await load.release(lease["id"]):
            errors += 1
    return {"kill9_leases": len(held), "kill9_interrupted_execs": interrupted, "errors_after_restart": errors}


def _report(args: argparse.Namespace, f: dict[str, Any]) -> None:
    ratio = f["cold_lease_p99_ms"] / f["warm_lease_p99_ms"] if f["warm_lease_p99_ms"] else float("nan")
    f["cold_over_warm_p99"] = ratio
    title = f"sandbox broker, {f['backend']} backend ({f['isolation']} isolation), {f['leases']} concurrent leases"
    print_table(title, [
        {"figure": "cold lease", "p50_ms": f["cold_lease_p50_ms"], "p99_ms": f["cold_lease_p99_ms"]},
        {"figure": f"cold lease, egress ({f['egress_leases']})", "p50_ms": f["egress_cold_lease_p50_ms"],
         "p99_ms": f["egress_cold_lease_p99_ms"]},
        {"figure": f"warm lease, burst of {f['leases']} (worker client)", "p50_ms": f["warm_lease_p50_ms"],
         "p99_ms": f["warm_lease_p99_ms"]},
        {"figure": f"warm lease, burst of {f['leases']}, a request each", "p50_ms": f["warm_lease_single_p50_ms"],
         "p99_ms": f["warm_lease_single_p99_ms"]},
        {"figure": f"warm lease, batch of {f['leases']}", "p50_ms": f["warm_lease_batch_p50_ms"],
         "p99_ms": f["warm_lease_batch_p99_ms"]},
        {"figure": f"  floor: {f['leases']} at once, no-op server", "p50_ms": f["burst_floor_p50_ms"],
         "p99_ms": f["burst_floor_p99_ms"]},
        {"figure": f"warm lease, paced at {f['paced_rate_per_s']:g}/s", "p50_ms": f["warm_lease_paced_p50_ms"],
         "p99_ms": f["warm_lease_paced_p99_ms"]},
        {"figure": "agent start: lease -> first gateway call", "p50_ms": f["agent_start_p50_ms"],
         "p99_ms": f["agent_start_p99_ms"]},
        {"figure": "exec under load", "p50_ms": f["exec_under_load_p50_ms"], "p99_ms": f["exec_under_load_p99_ms"]},
        {"figure": "exec via broker (seq)", "p50_ms": f["exec_broker_p50_ms"], "p99_ms": float("nan")},
        {"figure": "exec on bare backend (seq)", "p50_ms": f["exec_direct_p50_ms"], "p99_ms": float("nan")},
    ])  # fmt: skip
    for phase, figures in f.get("cold_create_phases", {}).items():
        print(
            f"  cold create, one at a time: {phase:8} wall {figures['wall_ms']:8.1f} ms  CPU "
            f"{figures['cpu_ms']:6.1f} ms  children CPU {figures['children_cpu_ms']:6.1f} ms  all CPU "
            f"{figures['all_cpu_ms']:6.1f} ms"
        )
    print(
        f"\ncold create CPU (broker and children; creation and release, no setup, no commands) "
        f"{f['cold_create_cpu_ms']:.1f} ms per sandbox (median of {f['cold_create_cpu_ms_rounds']}; a fixed "
        f"loop took {f['cpu_reference_ms']} ms before each), with egress {f['egress_cold_create_cpu_ms']:.1f} ms; "
        f"cold lease CPU (the template's setup and the episode included) {f['cold_lease_cpu_ms']:.1f} ms, "
        f"with egress {f['egress_cold_lease_cpu_ms']:.1f} ms"
    )
    print(f"\ncold/warm p99 ratio {ratio:.1f}x; exec overhead p50 {f['exec_overhead_p50_ms']:.2f} ms "
          f"(broker CPU {f['broker_cpu_ms_per_exec']:.2f} ms per exec); "
          f"warm hits {f['warm_hits']}/{f['leases']}; errors {f['errors']}; leaked {f['leaked']} "
          f"({f['leaked_sandboxes']} sandboxes, processes {f['leaked_processes']}); "
          f"kill -9 with {f['kill9_leases']} leases held: {f['kill9_interrupted_execs']} in-flight execs cut, "
          f"{f['errors_after_restart']} errors after restart")  # fmt: skip
    write_json(args.json, f)

"""``rollout bench fleet``: N episodes in flight through the whole platform.

Scripted SGLang-compatible engines play the field-shaped workload (turn counts, LLM latencies,
command durations; ``fleet_workload``), time-scaled; commands really run in local sandboxes
through the broker; LLM calls go through the proxy; work enters through the API. For each N the
job's ``max_in_flight`` is N and the queue is kept topped up, then a window is measured:

- ``trajectories_per_hour``: LLM calls per second x 3600 / mean turns of the workload (steady
  state without waiting for 80-turn episodes); ``completed_per_hour`` counts finishes directly;
- ``control_plane_cpu_ms_per_turn``: CPU of workers, proxy, broker (sandboxes and their exec agents
  included), API and Redis per LLM call (engines excluded: they stand in for GPUs; so are the
  commands the episodes run in their sandboxes, the tasks' own work: ``cpu_ms_per_turn_by_role``
  shows them as ``commands``);
- phase shares and the turn-cap hit rate over trajectories finished in the window;
- ``tail_share_after_90pct`` and the turn-cap rate of one synchronous batch (``--tail-batch``
  episodes submitted at once and waited for), run at its own time scale because 80-turn episodes at
  the steady-state scale would not finish within minutes.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from services.benchmarks import fleet_workload as workload
from services.benchmarks.fleet_stack import Stack
from services.benchmarks.report import write_json
from services.protocol import Trajectory, from_stream_fields, keys
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.secrets import FleetSecrets
from services.runtime.tables import print_table
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.backends.leftovers import remove_state_dir

SECRETS = FleetSecrets.generate()  # measured with authentication on, as deployed
ADMIN = SECRETS.admin_token
CONTROL_PLANE = ("worker", "proxy", "broker", "api")
SHORT_TURNS = 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fleet", help="episodes in flight through API, workers, proxy, engines and sandboxes")
    p.add_argument("--in-flight", default="100,384,1000", help="comma-separated N (default 100,384,1000)")
    p.add_argument("--time-scale", type=float, default=10.0, help="divide every field duration by this")
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--window-s", type=float, default=60.0, help="measured window per N")
    p.add_argument("--tail-batch", type=int, default=24, help="episodes of the synchronous tail batch (0: skip)")
    p.add_argument("--tail-time-scale", type=float, default=20.0, help="time scale of the tail batch")
    p.add_argument("--tail-wait-s", type=float, default=240.0, help="how long to wait for the tail batch")
    p.add_argument(
        "--field-pace",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the first and last N at --time-scale 1 (scaling_efficiency_field_pace)",
    )
    p.add_argument("--field-window-s", type=float, default=120.0, help="measured window per N at the field's pace")
    p.add_argument(
        "--capacity-time-scale",
        type=float,
        default=100.0,
        help="time scale of the capacity phase (capacity_turns_per_s at the largest N; 0: skip)",
    )
    p.add_argument("--engines", type=int, default=0, help="scripted engines (default: one per 200 in flight)")
    p.add_argument("--proxy-workers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--classes", type=int, default=64, help="distinct episode classes in the script")
    p.add_argument("--redis-url", default=None, help="default: an embedded server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    p.set_defaults(handler=run)


@dataclass
class Fleet:
    stack: Stack
    api: str
    workers: list[str]
    redis_url: str
    classes: list[workload.EpisodeClass]  # the steady-state workload
    tail_classes: list[workload.EpisodeClass]  # the synchronous tail batch
    field_classes: list[workload.EpisodeClass]  # the same workload at the field's own pace (time scale 1)
    capacity_classes: list[workload.EpisodeClass]  # compressed until the machine, not the workload, limits
    short_classes: list[workload.EpisodeClass]  # two turns each: a lease per two turns (the capacity bench)


def start_fleet(args: argparse.Namespace, root: Path, redis_url: str, max_n: int) -> Fleet:
    model = write_tokenizer_dir(root / "model")
    classes = workload.sample_classes(args.classes, args.time_scale, args.seed)
    tail = workload.sample_classes(args.tail_batch, args.tail_time_scale, args.seed + 1, prefix="TAIL")
    paced = workload.sample_classes(args.classes, 1.0, args.seed, prefix="FIELD")
    capacity = workload.sample_classes(args.classes, args.capacity_time_scale or 1.0, args.seed, prefix="CAP")
    short = workload.sample_classes(args.classes, args.time_scale, args.seed + 2, prefix="SHORT", turns=SHORT_TURNS)
    script = workload.write_script(root / "script.json", classes + tail + paced + capacity + short)
    state = root / "sandboxes"  # removed after the run (run()); both reachable by the sandbox user
    root.chmod(0o755)
    state.mkdir(mode=0o755)
    (root / "logs").mkdir()
    env = {**_base_env(), **SECRETS.env(), "ROLLOUT_REDIS_URL": redis_url,
           "ROLLOUT_WORKER_KEEP_MESSAGES": "false", "ROLLOUT_LOG_LEVEL": "WARNING"}  # fmt: skip
    stack = Stack(root / "logs", env)
    try:
        api, workers = start_services(stack, args, model, script, state, redis_url, max_n)
    except BaseException:
        stack.stop()  # nothing started is left behind
        raise
    return Fleet(stack, api, workers, redis_url, classes, tail, paced, capacity, short)


def start_services(
    stack: Stack, args: argparse.Namespace, model: Path, script: Path, state: Path, redis_url: str, max_n: int
) -> tuple[str, list[str]]:
    """Engines, proxy, broker, API and workers; returns the API's and the workers' URLs."""
    count = args.engines or max(1, math.ceil(max_n / 200))
    engines = [stack.start("engine", [
        "engine", "--mode", "scripted", "--script", str(script), "--model-path", str(model), "--port", "{port}",
        "--max-running-requests", "1024", "--decode-step-s", "0.0001", "--decode-step-per-request-s", "0",
        "--prefill-s-per-token", "0",
    ], health="/health").url for _ in range(count)]  # fmt: skip
    proxy = stack.start("proxy", ["proxy", "--port", "{port}", "--workers", str(args.proxy_workers),
                                  "--engines", ",".join(engines)]).url  # fmt: skip
    broker = stack.start("broker", ["broker", "--port", "{port}", "--backend", "local", "--redis-url", redis_url,
                                    "--state-dir", str(state)]).url  # fmt: skip
    api = stack.start("api", ["api", "--port", "{port}", "--redis-url", redis_url]).url
    per_worker = math.ceil(max_n / max(1, args.workers)) + 8
    workers = [stack.start("worker", [
        "worker", "--port", "{port}", "--redis-url", redis_url, "--proxy-url", proxy, "--broker-url", broker,
        "--model-path", str(model), "--concurrency", str(per_worker),
    ]).url for _ in range(args.workers)]  # fmt: skip
    return api, workers


def _base_env() -> dict[str, str]:
    return dict(os.environ)


def llm_calls(http: httpx.Client, workers: list[str]) -> float:
    return sum(metric_total(http.get(f"{url}/metrics").text, "rollout_worker_llm_calls_total") for url in workers)


def cpu_snapshot(fleet: Fleet, client: redis.Redis) -> dict[str, float]:
    """CPU seconds by role, and ``commands``: the CPU of the commands run in sandboxes (the brokers'
    ``rollout_broker_command_cpu_seconds_total``), which the broker's process tree holds (the exec
    agents reap them) and which are taken out of the broker's share here: the tasks' own work, as
    the engines' is theirs."""
    cpu = fleet.stack.cpu_seconds()
    info: Any = client.info("cpu")
    cpu["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    cpu["commands"] = sum(metric_total(httpx.get(f"{s.url}/metrics", timeout=30.0).text,
                                       "rollout_broker_command_cpu_seconds_total")
                          for s in fleet.stack.services if s.role == "broker")  # fmt: skip
    cpu["broker"] = cpu.get("broker", 0.0) - cpu["commands"]
    return cpu


def metric_total(text: str, name: str) -> float:
    """The sum of a Prometheus metric's series in an exposition ``text``."""
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + " ", name + "{")))


@dataclass(frozen=True)
class Snapshot:
    calls: float  # LLM calls answered, all workers
    cpu: dict[str, float]  # CPU seconds by role
    wall: float

    @classmethod
    def take(cls, http: httpx.Client, fleet: Fleet, client: redis.Redis) -> Snapshot:
        return cls(llm_calls(http, fleet.workers), cpu_snapshot(fleet, client), time.time())


class Submitter:
    """Keeps a job's queue topped up so that N episodes stay in flight (the job's max_in_flight)."""

    def __init__(self, http: httpx.Client, classes: list[workload.EpisodeClass], job: str, n: int) -> None:
        self.http, self.classes, self.job, self.n = http, classes, job, n
        created = http.post("/jobs", json={"job": job, "quotas": {"max_in_flight": n, "max_queued": 10 * n + 100}},
                            headers={"Authorization": f"Bearer {ADMIN}"})  # fmt: skip
        created.raise_for_status()
        self.headers = {"Authorization": f"Bearer {created.json()['token']}"}
        self.rollouts: list[str] = []
        self.submitted = 0

    def submit(self, count: int) -> str:
        classes = self.classes
        tasks = [
            workload.task_for(classes[(self.submitted + i) % len(classes)], f"t{self.submitted + i}")
            for i in range(count)
        ]
        body = {"job": self.job, "tasks": tasks, "group_size": 1, "limits": {"max_turns": workload.TURN_CAP}}
        response = self.http.post("/rollouts", json=body, headers=self.headers)
        response.raise_for_status()
        self.submitted += count
        rollout: str = response.json()["rollout_id"]
        self.rollouts.append(rollout)
        return rollout

    def top_up(self) -> None:
        status = self.http.get(f"/jobs/{self.job}", headers=self.headers).json()
        if status["queue_depth"] < self.n // 2:
            self.submit(self.n)

    def keep_up(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.top_up()
            time.sleep(1.0)

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.http.get(f"/rollouts/{rollout_id}", headers=self.headers).json()
        return answer

    def cancel_all(self) -> None:
        for rollout in self.rollouts:
            self.http.delete(f"/rollouts/{rollout}", headers=self.headers)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.http.get(f"/jobs/{self.job}", headers=self.headers).json()["in_flight"] == 0:
                return
            time.sleep(0.5)


def finished_between(client: redis.Redis, job: str, start: float, end: float) -> list[Trajectory]:
    entries: Any = client.xrange(keys.trajectory_stream(job))
    found = [from_stream_fields(fields) for _, fields in entries]
    return [t for t in found if start <= t.finished_at <= end and t.status.trainable]


def phase_shares(trajectories: list[Trajectory]) -> dict[str, float]:
    total = sum(t.timings.total_s for t in trajectories) or math.nan
    phases = {
        "llm": sum(t.timings.llm_s for t in trajectories),
        "exec": sum(t.timings.exec_s for t in trajectories),
        "sandbox_start": sum(t.timings.sandbox_start_s for t in trajectories),
        "setup": sum(t.timings.setup_s for t in trajectories),
        "reward": sum(t.timings.reward_s for t in trajectories),
    }
    shares = {name: value / total for name, value in phases.items()}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def measure(
    fleet: Fleet, args: argparse.Namespace, n: int, phase: str = "", classes: list[workload.EpisodeClass] | None = None
) -> dict[str, Any]:
    """One N in steady state: ``phase`` names the job, ``classes`` the workload (default the main one)."""
    classes = classes or fleet.classes
    window_s = args.field_window_s if phase == "field" else args.window_s
    client = redis.Redis.from_url(fleet.redis_url)
    with httpx.Client(base_url=fleet.api, timeout=60.0) as http:
        job = f"fleet-{phase}{n}"
        submitter = Submitter(http, classes, job, n)
        submitter.submit(n)
        submitter.submit(n)
        submitter.keep_up(args.warmup_s)
        before = Snapshot.take(http, fleet, client)
        submitter.keep_up(window_s)
        after = Snapshot.take(http, fleet, client)
        in_flight = http.get(f"/jobs/{job}", headers=submitter.headers).json()["in_flight"]
        submitter.cancel_all()
    done = finished_between(client, job, before.wall, after.wall)
    client.close()
    turns = after.calls - before.calls
    seconds = after.wall - before.wall
    cpu = {role: after.cpu.get(role, 0.0) - before.cpu.get(role, 0.0)
           for role in (*CONTROL_PLANE, "redis", "engine", "commands")}  # fmt: skip
    control = sum(cpu[r] for r in (*CONTROL_PLANE, "redis"))
    capped = sum(1 for t in done if t.truncation is not None and t.truncation.value == "turns")
    return {
        "in_flight": n,
        "in_flight_measured": in_flight,
        "turns_per_s": turns / seconds,
        "trajectories_per_hour": turns / seconds * 3600 / workload.mean_turns(classes),
        "completed_per_hour": len(done) / seconds * 3600,
        "control_plane_cpu_ms_per_turn": 1000 * control / turns if turns else math.nan,
        "cpu_ms_per_turn_by_role": {role: 1000 * v / turns if turns else math.nan for role, v in cpu.items()},
        "control_plane_cores": control / seconds,
        "phase_shares": phase_shares(done),
        "turn_cap_hit_rate": capped / len(done) if done else math.nan,
    }


def measure_tail(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """One synchronous batch, submitted at once and waited for: its tail figures."""
    with httpx.Client(base_url=fleet.api, timeout=60.0) as http:
        submitter = Submitter(http, fleet.tail_classes, "fleet-tail", args.tail_batch)
        rollout = submitter.submit(args.tail_batch)
        started = time.monotonic()
        status = submitter.rollout(rollout)
        while status["finished"] < status["total"] and time.monotonic() - started < args.tail_wait_s:
            time.sleep(1.0)
            status = submitter.rollout(rollout)
        complete = status["finished"] >= status["total"]
        if not complete:
            submitter.cancel_all()
    return {
        "episodes": args.tail_batch,
        "time_scale": args.tail_time_scale,
        "complete": complete,
        "batch_s": time.monotonic() - started,
        **status["tail"],
    }


def run(args: argparse.Namespace) -> int:
    ns = [int(v) for v in str(args.in_flight).split(",")]
    root = Path(tempfile.mkdtemp(prefix="rollout-fleet-"))
    results: list[dict[str, Any]] = []
    try:
        with redis_url_or_embedded(args.redis_url) as url:
            fleet = start_fleet(args, root, url, max(ns))
            try:
                tail = measure_tail(fleet, args) if args.tail_batch else {}
                for n in ns:
                    print(f"measuring N={n} ...", flush=True)
                    results.append(measure(fleet, args, n))
                extra = measure_extra(fleet, args, ns)
            finally:
                fleet.stack.stop()
    finally:  # the broker keeps the sandboxes of leases still live when it stops: they go here
        remove_state_dir(root / "sandboxes")
        shutil.rmtree(root, ignore_errors=True)
    report(args, fleet, results, tail, extra)
    return 0


def measure_extra(fleet: Fleet, args: argparse.Namespace, ns: list[int]) -> dict[str, Any]:
    """The field-pace scaling (first and last N at time scale 1) and the machine's capacity (the
    largest N with time compressed by ``--capacity-time-scale``)."""
    extra: dict[str, Any] = {}
    if args.field_pace:
        paced = []
        for n in sorted({ns[0], ns[-1]}):
            print(f"measuring N={n} at the field's pace ...", flush=True)
            paced.append(measure(fleet, args, n, "field", fleet.field_classes))
        extra["field_pace"] = paced
        extra["scaling_efficiency_field_pace"] = _efficiency(paced[0], paced[-1])
    if args.capacity_time_scale:
        print(f"measuring capacity: N={max(ns)} at time scale 1/{args.capacity_time_scale:g} ...", flush=True)
        capacity = measure(fleet, args, max(ns), "capacity", fleet.capacity_classes)
        extra["capacity"] = capacity
        extra["capacity_turns_per_s"] = capacity["turns_per_s"]
    return extra


def _efficiency(first: dict[str, Any], last: dict[str, Any]) -> float:
    """Throughput per episode in flight at the last N over the same at the first (1.0: linear)."""
    base = first["trajectories_per_hour"] / first["in_flight"]
    return (last["trajectories_per_hour"] / last["in_flight"]) / base if base else math.nan


def report(
    args: argparse.Namespace, fleet: Fleet, results: list[dict[str, Any]], tail: dict[str, Any], extra: dict[str, Any]
) -> None:
    rows = [{
        "N": r["in_flight"], "traj/h": r["trajectories_per_hour"], "done/h": r["completed_per_hour"],
        "turns/s": r["turns_per_s"], "cpu ms/turn": r["control_plane_cpu_ms_per_turn"],
        "cores": r["control_plane_cores"], "llm share": r["phase_shares"]["llm"],
        "cap rate": r["turn_cap_hit_rate"],
    } for r in results]  # fmt: skip
    print_table(f"fleet benchmark (time scale 1/{args.time_scale:g})", rows)
    first, last = results[0], results[-1]
    efficiency = _efficiency(first, last)
    print(f"\nscaling efficiency N={first['in_flight']} -> N={last['in_flight']}: {efficiency:.2f}")
    for row in extra.get("field_pace", []):
        print(f"field pace N={row['in_flight']}: {row['trajectories_per_hour']:.0f} traj/h, "
              f"{row['control_plane_cpu_ms_per_turn']:.2f} ms CPU/turn")  # fmt: skip
    for key in ("scaling_efficiency_field_pace", "capacity_turns_per_s"):
        if key in extra:
            print(f"{key}: {extra[key]:.2f}")
    if tail:
        print_table(f"synchronous batch of {tail['episodes']} (time scale 1/{tail['time_scale']:g})", [tail])
    write_json(args.json, {
        "benchmark": "fleet",
        "time_scale": args.time_scale,
        "workload_mean_turns": workload.mean_turns(fleet.classes),
        "trajectories_per_hour": {str(r["in_flight"]): r["trajectories_per_hour"] for r in results},
        "control_plane_cpu_ms_per_turn": {str(r["in_flight"]): r["control_plane_cpu_ms_per_turn"] for r in results},
        "phase_shares": {str(r["in_flight"]): r["phase_shares"] for r in results},
        "tail_share_after_90pct": tail.get("tail_share_after_90pct"),
        "tail_batch": tail,
        "turn_cap_hit_rate": {str(r["in_flight"]): r["turn_cap_hit_rate"] for r in results},
        "scaling_efficiency": efficiency,
        "scaling_efficiency_field_pace": extra.get("scaling_efficiency_field_pace"),
        "capacity_turns_per_s": extra.get("capacity_turns_per_s"),
        "field_pace": extra.get("field_pace"),
        "capacity": extra.get("capacity"),
        "runs": results,
    })  # fmt: skip

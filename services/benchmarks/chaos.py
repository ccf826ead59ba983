"""``rollout bench chaos``: the platform's own kill -9 and outage suite, on a real fleet on loopback.

Each scenario (``chaos_scenarios``) runs a rollout of its own job (``--tasks`` x ``--group-size``
trajectories of a three-turn episode whose reward checks what its commands wrote), kills -9 one
part of the fleet while episodes run (a worker, the broker, a proxy worker process, the proxy's
process group, the proxy's parent alone, an engine, Redis with AOF, the API in the middle of the
rollout's POST, the trainer reading the job's stream) or keeps the proxy or the broker down for
``--outage-s``, brings it back and waits for the rollout, at most ``--scenario-timeout-s``.

Then every trajectory is accounted for, by its (task, sample) id in the job's stream:

- ``lost``: submitted and never published (listed by id), plus, for the trainer, published and
  never delivered to it; ``duplicated``: published more than once;
- ``infra_errors``: published as ``infra_error``; ``infra_scored``: published as trainable with a
  reward other than 1.0 (an infrastructure failure scored as the agent's);
- ``leaked``: after every scenario, the leases still there past the deadline by which the broker
  must have reaped them (expiry, or create deadline while reserved), sandboxes left on the host
  after the broker's stop (the wait before it also lets the orphan sweep remove every sandbox no
  lease accounts for), mounts left under its state directory;
- ``recovery_s``: from the victim answering again to the last trajectory (for the trainer: the
  last delivery) of the scenario.

The top level sums them; ``recovery_s_max`` is the largest. Exit status 1 when anything was lost,
duplicated, scored from an infra failure or leaked.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from services.benchmarks.chaos_fleet import CREATE_TIMEOUT_S, REAP_MARGIN_S, ChaosFleet, start_chaos_fleet, wait_until
from services.benchmarks.chaos_scenarios import NAMES, Run, scenario
from services.benchmarks.report import write_json
from services.protocol import Status, keys
from services.rollout_api.dump import stream_entries
from services.runtime.processes import stop_group
from services.runtime.tables import print_table
from services.sandbox_broker.backends.leftovers import remove_state_dir

# CI size; its broker's create timeout (25 s) is ample for a dozen creates at once and brings the
# reaping of the reservations that a broker's kill cuts short (create deadline, orphan age) forward
SHORT = {"tasks": 3, "group_size": 2, "outage_s": 3.0, "redis_down_s": 1.0, "scenario_timeout_s": 120.0,
         "create_timeout_s": 25.0}  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chaos", help="kill -9 and outage scenarios on a real fleet: nothing lost, duplicated or leaked")
    p.add_argument("--scenarios", default=",".join(NAMES), help=f"comma-separated, of {','.join(NAMES)}")
    p.add_argument("--tasks", type=int, default=75, help="tasks per scenario")
    p.add_argument("--group-size", type=int, default=4, help="trajectories per task")
    p.add_argument("--outage-s", type=float, default=60.0, help="how long the proxy/broker outages last")
    p.add_argument("--redis-down-s", type=float, default=1.0, help="how long Redis stays down after its kill -9")
    p.add_argument("--scenario-timeout-s", type=float, default=600.0, help="the most a scenario's rollout may take")
    p.add_argument("--latency-s", type=float, default=0.3, help="the scripted engines' latency per turn")
    p.add_argument("--concurrency", type=int, default=24, help="episodes per worker (2 workers)")
    p.add_argument(
        "--create-timeout-s",
        type=float,
        default=CREATE_TIMEOUT_S,
        help="the broker's create timeout (what a lease cut short by a fault is reaped after)",
    )
    p.add_argument(
        "--short", action="store_true", help="CI size: 3 tasks x 2, 3 s outages, 120 s bound, 25 s create timeout"
    )
    p.add_argument("--json", type=Path, default=None)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.short:
        for name, value in SHORT.items():
            setattr(args, name, value)
    names = [n for n in args.scenarios.split(",") if n]
    if unknown := sorted(set(names) - set(NAMES)):
        raise SystemExit(f"unknown scenarios: {', '.join(unknown)} (known: {', '.join(NAMES)})")
    root = Path(tempfile.mkdtemp(prefix="rollout-chaos-"))
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    try:
        fleet = start_chaos_fleet(root, latency_s=args.latency_s, worker_concurrency=args.concurrency,
                                  create_timeout_s=args.create_timeout_s)  # fmt: skip
        try:
            runs = [run_one(fleet, args, name, results) for name in names]
            leftovers = wait_settled(fleet, runs, results)
        finally:
            fleet.stop()
            fleet.redis.stop()
        leftovers["sandboxes_after_stop"] = count_dirs(fleet.state_dir / "sandboxes")
        leftovers["mounts"] = len(remove_state_dir(fleet.state_dir))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarize(results, leftovers, time.monotonic() - started)
    report(args, summary)
    bad = summary["lost"] + summary["duplicated"] + summary["infra_scored"] + summary["leaked"]
    return 1 if bad else 0


def run_one(fleet: ChaosFleet, args: argparse.Namespace, name: str, results: dict[str, dict[str, Any]]) -> Run:
    print(f"scenario {name} ...", flush=True)
    job = f"chaos-{name.replace('_', '-')}"
    one = Run(name, fleet, job, args.tasks, args.group_size, args.outage_s, args.redis_down_s)
    one.create_job()
    began = time.monotonic()
    error = ""
    try:
        scenario(name)(one)
        finished = wait_finished(one, args.scenario_timeout_s)
    except (TimeoutError, RuntimeError) as exc:  # the scenario could not go on: its work is accounted as it stands
        error, finished = str(exc), False
    done_at = time.time()
    if one.trainer_out is not None and finished:
        done_at = wait_trainer(fleet, one, args.scenario_timeout_s)
    results[name] = account(fleet, one)
    for proc in one.processes:
        stop_group(proc)
    results[name].update(finished=finished, error=error, scenario_s=time.monotonic() - began,
                         recovery_s=max(0.0, done_at - one.back_at) if one.back_at and finished else None)  # fmt: skip
    if not finished and one.rollout_id:  # bound what keeps running into the next scenario
        with one.http() as http:
            http.delete(f"/rollouts/{one.rollout_id}", headers=one.headers)
    return one


def wait_finished(one: Run, timeout_s: float) -> bool:
    try:
        wait_until(f"{one.job} to finish", lambda: (s := one.status())["finished"] >= s["total"], timeout_s, 0.2)
    except TimeoutError:
        return False
    return True


def wait_trainer(fleet: ChaosFleet, one: Run, timeout_s: float) -> float:
    """When the trainer had every trajectory and acknowledged it (the bound's end if never)."""
    client = redis.Redis.from_url(fleet.redis.url)
    stream = keys.trajectory_stream(one.job)
    try:
        total = one.tasks * one.group_size
        wait_until(f"{one.job}'s trainer to catch up", lambda: len(trainer_ids(one)) >= total
                   and int(client.xpending(stream, keys.TRAINERS_GROUP)["pending"]) == 0, timeout_s)  # fmt: skip
    except TimeoutError:
        pass
    finally:
        client.close()
    return time.time()


def trainer_ids(one: Run) -> list[str]:
    if one.trainer_out is None or not one.trainer_out.exists():
        return []
    return [line.split()[1] for line in one.trainer_out.read_text().splitlines() if len(line.split()) == 2]


def account(fleet: ChaosFleet, one: Run) -> dict[str, Any]:
    client = redis.Redis.from_url(fleet.redis.url)
    try:
        found = [t for _, t in stream_entries(client, one.job)]
        pending = 0
        if one.trainer_out is not None:
            groups: Any = client.xinfo_groups(keys.trajectory_stream(one.job))
            pending = sum(int(g["pending"]) for g in groups)
    finally:
        client.close()
    ids = Counter(f"{t.task_id}#{t.sample_index}" for t in found)
    expected = {f"{one.job}-t{i}#{s}" for i in range(one.tasks) for s in range(one.group_size)}
    lost = sorted(expected - set(ids))
    result: dict[str, Any] = {
        "trajectories": one.tasks * one.group_size,
        "published": len(found),
        "lost": len(lost),
        "lost_ids": lost[:50],
        "duplicated": sum(n - 1 for n in ids.values() if n > 1),
        "infra_errors": sum(1 for t in found if t.status is Status.INFRA_ERROR),
        "infra_scored": sum(1 for t in found if t.status.trainable and t.reward != 1.0),
        "statuses": dict(Counter(t.status.value for t in found)),
        "attempts_max": max((t.attempt for t in found), default=0),
        "outage_s": max(0.0, one.back_at - one.fault_at) if one.fault_at else None,
        **one.notes,
    }
    if one.trainer_out is not None:
        seen = Counter(trainer_ids(one))
        missing = sorted({t.trajectory_id for t in found} - set(seen))
        result.update(trainer_missing=len(missing), trainer_redelivered=sum(n - 1 for n in seen.values() if n > 1),
                      trainer_pending=pending)  # fmt: skip
        result["lost"] += len(missing)
        result["leaked"] = pending
    return result


def wait_settled(fleet: ChaosFleet, runs: list[Run], results: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Wait until every lease has ended and every sandbox is gone from the host, or until what is
    left is past the deadline by which the broker must have removed it: a lease past its expiry (or
    its create deadline while reserved) by more than the reaper needs; a sandbox no live lease
    accounts for, older than the orphan sweep's threshold. Those leaked. ``leases_left`` is how many
    leases each job still had when the wait began. Returns the leaked sandboxes (all jobs)."""
    client = redis.Redis.from_url(fleet.redis.url, decode_responses=True)
    try:
        left = {one.job: len(client.smembers(keys.job_leases(one.job))) for one in runs}
        overdue: dict[str, int] = {}
        orphans: list[str] = []

        def settled() -> bool:
            nonlocal overdue, orphans
            now, waiting, leased = time.time(), False, set()
            overdue = dict.fromkeys(left, 0)
            for job in left:
                for lease in client.smembers(keys.job_leases(job)):
                    deadline = client.zscore(keys.leases_index(), lease)
                    if deadline is None or deadline < now - REAP_MARGIN_S:
                        overdue[job] += 1
                    else:
                        waiting = True
                    leased.add(str(client.hget(keys.lease(str(lease)), "sandbox_id") or ""))
            unleased = {s: age for s, age in fleet.sandboxes().items() if s not in leased}
            orphans = sorted(s for s, age in unleased.items() if age > fleet.orphan_age_s)
            return not waiting and len(orphans) == len(unleased)

        try:
            wait_until("every lease and sandbox to end or pass its deadline", settled, 600.0, 0.5)
        except TimeoutError:
            pass
    finally:
        client.close()
    for one in runs:
        results[one.name]["leases_left"] = left[one.job]
        results[one.name]["leaked"] = results[one.name].get("leaked", 0) + overdue.get(one.job, 0)
    return {"sandboxes_past_reaping": len(orphans)}


def count_dirs(path: Path) -> int:
    return sum(1 for _ in path.iterdir()) if path.is_dir() else 0


def summarize(results: dict[str, dict[str, Any]], leftovers: dict[str, int], wall_s: float) -> dict[str, Any]:
    recoveries = [r["recovery_s"] for r in results.values() if r.get("recovery_s") is not None]
    return {
        "benchmark": "chaos",
        "scenarios": results,
        "lost": sum(r["lost"] for r in results.values()),
        "duplicated": sum(r["duplicated"] for r in results.values()),
        "infra_scored": sum(r["infra_scored"] for r in results.values()),
        "infra_errors": sum(r["infra_errors"] for r in results.values()),
        "leaked": sum(r.get("leaked", 0) for r in results.values())
        + leftovers["sandboxes_after_stop"]
        + leftovers["mounts"],
        "leftovers": leftovers,
        "unfinished": sorted(name for name, r in results.items() if not r["finished"]),
        "recovery_s_max": max(recoveries, default=None),
        "wall_s": wall_s,
    }


def report(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    rows = [{
        "scenario": name, "trajectories": r["trajectories"], "lost": r["lost"], "duplicated": r["duplicated"],
        "infra errors": r["infra_errors"], "infra scored": r["infra_scored"], "leaked": r.get("leaked", 0),
        "attempts max": r["attempts_max"], "recovery s": r["recovery_s"], "finished": r["finished"],
    } for name, r in summary["scenarios"].items()]  # fmt: skip
    print_table("chaos: kill -9 and outages", rows)
    print(f"\nlost {summary['lost']}, duplicated {summary['duplicated']}, infra scored {summary['infra_scored']}, "
          f"leaked {summary['leaked']}, recovery_s_max {summary['recovery_s_max']}")  # fmt: skip
    write_json(args.json, summary)

"""``rollout demo --jobs N``: N training jobs share one fleet (API, worker, proxy, broker, Redis).

Job ``i`` (``demo-i``) has fair-share weight ``i + 1``, its own pool of engines (``demo-i``: the
engines serve the job's own weights) and its own trainer, all trainers running at once; each job
runs its held-out evaluations in itself (``mode="eval"`` rollouts). What the run shows, from the
jobs' trajectory streams:

- ``throughput_share``: each job's share of the trajectories the fleet finished for it (training
  and its held-out evaluations, which it runs in itself under its own weight) while every job was
  still at work (after the first job stops, the others have the fleet to themselves); with weights
  1 and 2 it should be close to 1/3 and 2/3. ``training_share``: the same over training
  trajectories only (a job that evaluates has no training items queued meanwhile, so the other
  job's training gets more than its weight then);
- ``foreign_version_turns``: turns of a job served by an engine outside its pool, or by weights its
  own trainer never posted (must be 0: jobs never see each other's weights).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from services.fleet import summary
from services.fleet.launcher import Fleet
from services.llm_proxy.membership import engine_id_of
from services.protocol.trajectory import Trajectory
from services.protocol.weights import INITIAL_VERSION
from services.rollout_api.dump import stream_entries
from services.runtime.processes import REPO_ROOT, stop_group
from services.runtime.sync_redis import open_sync_redis
from services.runtime.tables import print_table
from trainer_client.evaluation import EvalRecord
from trainer_client.metrics import StepRecord

if TYPE_CHECKING:
    from services.fleet.run import JobSpec, UpOptions

Command = tuple[list[str], dict[str, str]]


def train_together(
    fleet: Fleet, specs: list[JobSpec], commands: list[Command], steps: int
) -> tuple[int, dict[str, Any]]:
    """Run every job's trainer at once (logs in ``<job dir>/trainer.log``); returns the worst exit
    code and what the jobs' streams show (read before the fleet stops)."""
    procs = []
    for spec, (argv, env) in zip(specs, commands, strict=True):
        spec.work_dir.mkdir(parents=True, exist_ok=True)
        with (spec.work_dir / "trainer.log").open("wb") as log:
            procs.append(subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
    try:
        _follow(specs, procs, steps)
    finally:
        for proc in procs:
            stop_group(proc, timeout_s=30)
    codes = [proc.returncode for proc in procs]
    for spec, code in zip(specs, codes, strict=True):
        if code != 0:
            print(f"error: the trainer of {spec.name} exited with {code} (log: {spec.work_dir / 'trainer.log'})")
    return max(codes, key=abs), streams(fleet, specs)


def _follow(specs: list[JobSpec], procs: list[subprocess.Popen[bytes]], steps: int) -> None:
    """One progress bar per job: its GRPO steps, read from its trainer's step log."""
    bars = [tqdm(total=steps, desc=f"{s.name} (weight {s.weight:g})", unit="step", position=i)
            for i, s in enumerate(specs)]  # fmt: skip
    try:
        while any(proc.poll() is None for proc in procs):
            for spec, bar in zip(specs, bars, strict=True):
                bar.update(len(summary.read_jsonl(spec.trainer_dir / "steps.jsonl")) - bar.n)
            time.sleep(2)
    finally:
        for bar in bars:
            bar.close()


def streams(fleet: Fleet, specs: list[JobSpec]) -> dict[str, Any]:
    """Per job: finish times of its trajectories (training and evaluation) and its foreign turns;
    the shares while all were at work."""
    engines = {pool: {engine_id_of(url) for url in urls} for pool, urls in fleet.pool_engines().items()}
    client = open_sync_redis(fleet.redis_url)
    trained: dict[str, list[float]] = {}
    evaluated: dict[str, list[float]] = {}
    foreign: dict[str, int] = {}
    try:
        for spec in specs:
            own, pool = posted_versions(spec), engines[spec.pool]
            foreign[spec.name] = 0
            for mode, job, into in (("train", spec.name, trained), ("eval", spec.eval_job, evaluated)):
                entries = list(stream_entries(client, job, mode))
                into[spec.name] = [_finished_at(entry_id) for entry_id, _ in entries]
                foreign[spec.name] += sum(foreign_turns(t, pool, own) for _, t in entries)
    finally:
        client.close()
    finished = {job: sorted(trained[job] + evaluated[job]) for job in trained}
    start, end = shared_window(finished)
    during, training = within(finished, start, end), within(trained, start, end)
    return {
        "trajectories": {job: len(ts) for job, ts in trained.items()},
        "evaluation_trajectories": {job: len(ts) for job, ts in evaluated.items()},
        "foreign_version_turns": foreign,
        "shared_window_s": round(end - start, 1),
        "trajectories_while_shared": during,
        "training_trajectories_while_shared": training,
        "throughput_share": shares(during),
        "training_share": shares(training),
    }


def _finished_at(entry_id: str) -> float:
    return int(entry_id.split("-")[0]) / 1000


def shared_window(finished: dict[str, list[float]]) -> tuple[float, float]:
    """From the moment every job had finished a trajectory to the moment the first job finished its last."""
    times = [ts for ts in finished.values() if ts]
    if len(times) < len(finished) or not times:
        return 0.0, 0.0
    return max(ts[0] for ts in times), min(ts[-1] for ts in times)


def within(finished: dict[str, list[float]], start: float, end: float) -> dict[str, int]:
    """Per job: how many of its trajectories finished in ``[start, end]``."""
    return {job: sum(start <= t <= end for t in ts) for job, ts in finished.items()}


def shares(counts: dict[str, int]) -> dict[str, float | None]:
    total = sum(counts.values())
    return {job: round(n / total, 4) if total else None for job, n in counts.items()}


def posted_versions(spec: JobSpec) -> set[str]:
    """Every weight version the job's trainer put on its engines: the initial, SFT's and each step's."""
    trainer = spec.trainer_dir
    found = {INITIAL_VERSION}
    found |= {r["version"] for r in summary.read_jsonl(trainer / "steps.jsonl")}
    found |= {r["version"] for r in summary.read_jsonl(trainer / "evals.jsonl")}
    return found


def foreign_turns(trajectory: Trajectory, pool_engines: set[str], own_versions: set[str]) -> int:
    return sum(t.engine_id not in pool_engines or t.weight_version not in own_versions for t in trajectory.turns)


def report(opts: UpOptions, specs: list[JobSpec], shared: dict[str, Any], wall_s: float) -> int:
    """Print each job's figures and the shares; write the JSON (``jobs``, ``throughput_share``)."""
    per_job = []
    for spec in specs:
        steps = [StepRecord.model_validate(r) for r in summary.read_jsonl(spec.trainer_dir / "steps.jsonl")]
        evals = [EvalRecord.model_validate(r) for r in summary.read_jsonl(spec.trainer_dir / "evals.jsonl")]
        fig = summary.figures(opts, steps, evals, wall_s)
        per_job.append({
            "job": spec.name, "pool": spec.pool, "weight": spec.weight,
            "pass_at_1_base": fig["pass_at_1_base"], "pass_at_1_sft": fig["pass_at_1_sft"],
            "pass_at_1_rl": fig["pass_at_1_rl"], "steps": fig["steps"],
            "trajectories": shared["trajectories"][spec.name],
            "evaluation_trajectories": shared["evaluation_trajectories"][spec.name],
            "trajectories_trained": fig["trajectories"],
            "trajectories_while_shared": shared["trajectories_while_shared"][spec.name],
            "training_trajectories_while_shared": shared["training_trajectories_while_shared"][spec.name],
            "foreign_version_turns": shared["foreign_version_turns"][spec.name],
            "evaluations": fig["evaluations"],
        })  # fmt: skip
    print_table("jobs sharing the fleet", [{k: v for k, v in job.items() if k != "evaluations"} for job in per_job])
    out = {
        "jobs": per_job, "throughput_share": shared["throughput_share"], "training_share": shared["training_share"],
        "shared_window_s": shared["shared_window_s"],
        "weights": {spec.name: spec.weight for spec in specs}, "heldout_tasks": opts.heldout_tasks,
        "wall_s": round(wall_s, 1), "seed": opts.seed, "load_average_at_end": list(os.getloadavg()),
    }  # fmt: skip
    print(f"\nthroughput share while all were at work: {out['throughput_share']} (training only "
          f"{out['training_share']}; weights {out['weights']}); "
          f"foreign-version turns: {shared['foreign_version_turns']}")  # fmt: skip
    if opts.json_path:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"summary: {opts.json_path}")
    missing = [job["job"] for job in per_job if job["steps"] < opts.steps]
    if missing:
        print(f"error: {', '.join(missing)} recorded fewer than {opts.steps} GRPO steps")
        return 1
    return 0

"""The faults of ``rollout bench chaos``: each kills -9 (or keeps down) one part of a running fleet
while a rollout of its own job runs, and brings it back. A scenario submits its work, waits until
episodes run, injects its fault and returns once the victim is back; the bench then waits for the
work and accounts for every trajectory (``chaos.py``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.benchmarks.chaos_fleet import ChaosFleet, task, wait_until
from services.runtime.processes import python_env


@dataclass
class Run:
    """One scenario's job, its rollout and the times the bench reports."""

    name: str
    fleet: ChaosFleet
    job: str
    tasks: int
    group_size: int
    outage_s: float
    redis_down_s: float
    headers: dict[str, str] = field(default_factory=dict)
    rollout_id: str = ""
    fault_at: float = 0.0  # wall clock: the fault was injected
    back_at: float = 0.0  # wall clock: the victim answers again
    notes: dict[str, Any] = field(default_factory=dict)
    trainer_out: Path | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)  # stopped after the scenario

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.fleet.api_url, timeout=30.0)

    def body(self) -> dict[str, Any]:
        tasks = [task(f"{self.job}-t{i}") for i in range(self.tasks)]
        return {"job": self.job, "tasks": tasks, "group_size": self.group_size, "idempotency_key": f"{self.job}-1"}

    def create_job(self) -> None:
        with self.http() as http:
            created = http.post("/jobs", json={"job": self.job}, headers=self.fleet.admin())
            created.raise_for_status()
        self.headers = {"Authorization": f"Bearer {created.json()['token']}"}

    def submit(self, timeout_s: float = 120.0) -> str:
        """POST the rollout until it is accepted (the same idempotency key each time: one rollout)."""

        def post() -> str | None:
            with self.http() as http:
                answer = http.post("/rollouts", json=self.body(), headers=self.headers)
            if answer.status_code != 202:
                return None
            rollout: str = answer.json()["rollout_id"]
            return rollout

        self.rollout_id = wait_until("the rollout to be accepted", post, timeout_s, every_s=0.5)
        return self.rollout_id

    def status(self) -> dict[str, Any]:
        with self.http() as http:
            answer = http.get(f"/rollouts/{self.rollout_id}", headers=self.headers)
            answer.raise_for_status()
            status: dict[str, Any] = answer.json()
            return status

    def wait_running(self, timeout_s: float = 120.0, *, or_ran: bool = False) -> None:
        """Until episodes run; with ``or_ran``, also once some have finished (after a fault, the
        rollout may have run to its end before the first look)."""

        def running() -> bool:
            status = self.status()
            return bool(status["in_flight"] or (or_ran and status["finished"]))

        wait_until("episodes to run", running, timeout_s)

    def faulted(self) -> None:
        self.fault_at = time.time()

    def back(self) -> None:
        self.back_at = time.time()


def kill_and_restart(name: str, down_s: float = 0.0) -> Callable[[Run], None]:
    def scenario(run: Run) -> None:
        run.submit()
        run.wait_running()
        run.faulted()
        run.fleet.kill(name)
        time.sleep(down_s)
        run.fleet.restart(name)
        run.back()

    return scenario


def worker(run: Run) -> None:
    """kill -9 a worker with episodes running; the other reclaims them, a replacement starts."""
    run.submit()
    run.wait_running()
    run.faulted()
    victim = run.fleet.workers.pop(0)
    victim.kill(signal.SIGKILL)
    run.fleet.start_worker()
    run.back()


def proxy_child(run: Run) -> None:
    """kill -9 one of the proxy's worker processes: the parent starts another."""
    parent = run.fleet.services["proxy"].proc.pid
    run.submit()
    run.wait_running()
    before = spawned_children(parent)
    run.faulted()
    os.kill(before[0], signal.SIGKILL)
    wait_until("the proxy to replace its worker", lambda: len(set(spawned_children(parent)) - set(before)) >= 1, 60)
    run.back()


def proxy_parent(run: Run) -> None:
    """kill -9 the proxy's parent alone: its children follow it (parent-death signal); restarted."""
    service = run.fleet.services["proxy"]
    run.submit()
    run.wait_running()
    children = spawned_children(service.proc.pid)
    run.faulted()
    os.kill(service.proc.pid, signal.SIGKILL)
    service.proc.wait(timeout=10)
    wait_until("the proxy's children to exit", lambda: not any(os.path.exists(f"/proc/{c}") for c in children), 30)
    run.fleet.restart("proxy")
    run.back()


def redis(run: Run) -> None:
    """kill -9 Redis (AOF on), down for ``redis_down_s``, started again from its AOF."""
    run.submit()
    run.wait_running()
    run.faulted()
    run.fleet.redis.kill()
    time.sleep(run.redis_down_s)
    run.fleet.redis.start()
    run.back()


def api_mid_post(run: Run) -> None:
    """kill -9 the API while the rollout's POST is in flight; the client posts again with the same
    idempotency key once the API is back: one rollout, whether or not the first POST got in."""
    answered: list[int] = []

    def post() -> None:
        try:
            with run.http() as http:
                answered.append(http.post("/rollouts", json=run.body(), headers=run.headers).status_code)
        except httpx.HTTPError:
            answered.append(0)

    sender = threading.Thread(target=post)
    sender.start()
    time.sleep(random.uniform(0.0, 0.05))
    run.faulted()
    run.fleet.kill("api")
    sender.join(timeout=60)
    run.fleet.restart("api")
    run.back()
    run.notes["first_post_status"] = answered[0] if answered else 0
    run.submit()
    run.wait_running(or_ran=True)  # the first POST may have got in, and its episodes run while the API restarted


def trainer(run: Run) -> None:
    """kill -9 the trainer (a consumer group reader) mid-stream; the restarted one replays what was
    pending. The bench then waits until every trajectory reached it and nothing is pending."""
    run.trainer_out = run.fleet.root / f"{run.job}.trainer"
    proc = start_trainer(run)
    run.submit()
    wait_until("the trainer to consume", lambda: run.trainer_out and run.trainer_out.exists(), 300)
    run.faulted()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    start_trainer(run)
    run.back()


def start_trainer(run: Run) -> subprocess.Popen[bytes]:
    assert run.trainer_out is not None
    ready = run.trainer_out.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "services.benchmarks.chaos_trainer", "--redis-url", run.fleet.redis.url,
            "--job", run.job, "--out", str(run.trainer_out)]  # fmt: skip
    log = (run.fleet.logs / f"{run.job}-trainer.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=python_env(), start_new_session=True)
    log.close()
    run.processes.append(proc)
    wait_until("the trainer to start", ready.exists, 60)
    return proc


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing children (``spawn_main``) of ``pid``: a proxy's worker processes."""
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    found = []
    for child in listed:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(int(child))
    return found


SCENARIOS: dict[str, Callable[[Run], None]] = {
    "worker": worker,
    "broker": kill_and_restart("broker"),
    "proxy_child": proxy_child,
    "proxy_group": kill_and_restart("proxy"),
    "proxy_parent": proxy_parent,
    "engine": kill_and_restart("engine-0"),
    "redis_aof": redis,
    "api_mid_post": api_mid_post,
    "trainer": trainer,
}
OUTAGES: dict[str, str] = {"proxy_outage": "proxy", "broker_outage": "broker"}  # down for ``outage_s``


def scenario(name: str) -> Callable[[Run], None]:
    if name in OUTAGES:
        victim = OUTAGES[name]
        return lambda run: kill_and_restart(victim, run.outage_s)(run)
    return SCENARIOS[name]


NAMES = [*SCENARIOS, *OUTAGES]

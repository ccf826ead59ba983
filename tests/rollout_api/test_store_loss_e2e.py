"""A Redis that restarts empty under load (issue 29): every service says so (its log, once, and its
``/healthz``) and none restarts; the API answers 503 with Retry-After while Redis is away; the
vanished job's trainer is told the job is gone; the broker reaps every sandbox whose lease was
lost, leaving no directory, cgroup or mount; nothing is recreated for the vanished job; and a job
created afterwards completes every trajectory (the proxy serves its pools again).

Sized for a small machine: ``ROLLOUT_TEST_STORE_LOSS_TRAJECTORIES`` trajectories per job (24)."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout_client.errors import JobGone
from rollout_client.stream import TrajectoryConsumer
from services.protocol import Status, keys
from services.runtime.sync_redis import open_sync_redis
from services.sandbox_broker.backends import overlay
from services.sandbox_broker.backends.cgroups import Cgroups
from tests.rollout_api.fleet import (
    ADMIN,
    SUBMIT,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    submit,
    task,
    trajectories,
    wait_finished,
    wait_for,
)
from tests.support.processes import ServiceProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRAJECTORIES = int(os.environ.get("ROLLOUT_TEST_STORE_LOSS_TRAJECTORIES", "24"))  # per job, groups of 4
RULES: dict[str, list[Any]] = {
    "TASK-HOLD": [
        {"text": "```bash\necho 4 > a.txt\n```", "latency_s": 1.0},
        {"text": "```bash\necho 42 > answer.txt\n```", "latency_s": 1.0},
        {"text": SUBMIT, "latency_s": 0.5},
    ],  # fmt: skip
}
LOST = "Redis lost its state"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(tmp_path, RULES, "store-loss") as fleet:
        yield fleet


def _sandboxes(state_dir: Path) -> set[str]:
    root = state_dir / "sandboxes"
    return {p.name for p in root.iterdir() if p.name.startswith("loc-")} if root.is_dir() else set()


def _left_on_host(state_dir: Path) -> dict[str, Any]:
    cgroups = Cgroups("v1", scope=Cgroups.scope_of(state_dir / "sandboxes")).list_ids()
    return {"dirs": _sandboxes(state_dir), "cgroups": cgroups, "mounts": overlay.mounts_under(state_dir / "sandboxes")}


def _leases(broker: ServiceProcess) -> list[Any]:
    leases: list[Any] = httpx.get(broker.url + "/leases", headers=bearer(ADMIN), timeout=10).json()
    return leases


def _reaped(broker: ServiceProcess) -> float:
    found = re.search(r'rollout_broker_sandboxes_reaped_total\{reason="store_lost"\} ([0-9.]+)',
                      httpx.get(broker.url + "/metrics", timeout=10).text)  # fmt: skip
    return float(found.group(1)) if found else 0.0


def _tasks(prefix: str) -> list[dict[str, Any]]:
    return [task(f"{prefix}{i}", f"TASK-HOLD {prefix} {i}") for i in range(max(1, TRAJECTORIES // 4))]


def _healthz(service: ServiceProcess) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = httpx.get(service.url + "/healthz", timeout=5).json()
        return doc
    except (httpx.HTTPError, ValueError):
        return {}


def _wait_reported(name: str, service: ServiceProcess) -> None:
    wait_for(f"{name} to report the loss", lambda: "store_lost" in _healthz(service), timeout_s=60)
    wait_for(f"{name} to log the loss", lambda: LOST in service.log(), timeout_s=60)


@pytest.mark.timeout(300)
def test_a_redis_restarted_empty_under_load(fleet: Fleet) -> None:
    assert fleet.redis is not None
    worker = fleet.start_worker(concurrency=8)
    services = {"api": fleet.api, "worker": worker, "broker": fleet.broker, "proxy": fleet.proxy}
    pids = {name: s.proc.pid for name, s in services.items()}
    store = open_sync_redis(fleet.redis_url)
    with fleet.client() as client:
        before = create_job(client, "before")
        consumer = TrajectoryConsumer(store, "before")  # a trainer reading the job's stream
        consumer.ensure_group()
        submit(client, before, {"job": "before", "tasks": _tasks("b"), "group_size": 4})
        wait_for("live leases", lambda: len(_leases(fleet.broker)) >= 4, timeout_s=120)

        fleet.redis.stop()  # no persistence: it comes back empty
        away = client.get("/jobs/before", headers=before)
        assert away.status_code == 503 and "retry-after" in away.headers, away.text
        fleet.redis.start()
        lost_at = time.monotonic()

        for name, service in services.items():  # each says so in its /healthz and (once) in its log
            _wait_reported(name, service)
        reported_s = time.monotonic() - lost_at
        wait_for("the orphaned sandboxes reaped", lambda: not _sandboxes(fleet.state_dir), timeout_s=60)
        reaped_s = time.monotonic() - lost_at
        assert _reaped(fleet.broker) >= 1  # live leases' sandboxes (ones still starting are destroyed by their start)
        print(
            f"every service reported the loss {reported_s:.1f} s after the restart; sandboxes reaped {reaped_s:.1f} s"
        )

        with pytest.raises(JobGone):  # the trainer is told, not left waiting
            consumer.read(count=10, block_ms=100)
        assert client.get("/jobs/before", headers=before).status_code in (401, 404)  # its token went with it

        after = create_job(client, "after")
        rollout = submit(client, after, {"job": "after", "tasks": _tasks("a"), "group_size": 4})
        wait_finished(client, after, rollout, timeout_s=300)

    found = trajectories(fleet.redis_url, "after")
    assert Counter(t.status for t in found) == {Status.COMPLETED: len(found)} and len(found) == 4 * len(_tasks("a"))
    assert list(store.scan_iter(f"{keys.PREFIX}:job:{{before}}*")) == []  # nothing recreated for the vanished job
    store.close()
    for name, service in services.items():  # none restarted, none said it twice
        assert service.alive() and service.proc.pid == pids[name], name
        assert service.log().count(LOST) == 1, name
    assert "exited with" not in fleet.proxy.log()  # no proxy worker process died
    wait_for("the new job's sandboxes released", lambda: not _sandboxes(fleet.state_dir), timeout_s=60)
    assert _left_on_host(fleet.state_dir) == {"dirs": set(), "cgroups": [], "mounts": []}

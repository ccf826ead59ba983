"""Outages are waited out: the proxy, and separately the broker, killed (kill -9) while 96
trajectories run or wait (48 run at once, the rest queued); after it comes back every trajectory
completes, none as ``infra_error``, none lost, none twice.

The outage outlasts every time limit of the ordinary infra path that it could meet: the workers'
retries (a 0.2 s backoff doubling over 5 deliveries: about 6 s), their reclaim idle time (3 s)
and, twice over, their lease TTL (10 s here), so that a broker outage leaves leases expired when
the broker comes back. The outage budget (10 minutes) is the default. With these settings 25 s
proves what a minute did with the fleet's 30 s lease TTL, in less of the suite's time."""

from __future__ import annotations

import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.protocol import Status
from tests.rollout_api.fleet import (
    SECRETS,
    SUBMIT,
    Fleet,
    create_job,
    running_fleet,
    submit,
    task,
    trajectories,
    wait_finished,
    wait_for,
)
from tests.support.processes import ServiceProcess, start_service

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LEASE_TTL_S = 10.0  # renewed every 0.5 s (the fleet's heartbeat)
OUTAGE_S = 2.5 * LEASE_TTL_S
TRAJECTORIES = 96  # 24 tasks x groups of 4: two workers run 48 at once, the others wait in the queue
RULES: dict[str, list[Any]] = {
    "TASK-HOLD": [
        {"text": "```bash\necho 4 > a.txt\n```", "latency_s": 0.3},
        {"text": "```bash\necho 42 > answer.txt\n```", "latency_s": 0.3},
        {"text": SUBMIT, "latency_s": 0.3},
    ],  # fmt: skip
}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(tmp_path, RULES, "outage") as fleet:
        yield fleet


def restart(service: ServiceProcess, logs: Path, env: dict[str, str]) -> ServiceProcess:
    """The same command on the same port (the broker keeps its instance name, so its leases)."""
    return start_service(service.argv[1:], log_dir=logs, port=service.port, env=env, name="restarted")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("victim", ["proxy", "broker"])
def test_an_outage_longer_than_the_lease_ttl_is_waited_out(fleet: Fleet, victim: str) -> None:
    with fleet.client() as client:
        headers = create_job(client, "hold")
        for _ in range(2):
            fleet.start_worker(jobs=["hold"], concurrency=24, ROLLOUT_WORKER_LEASE_TTL_S=f"{LEASE_TTL_S:g}")
        tasks = [task(f"t{i}", f"TASK-HOLD {i}") for i in range(TRAJECTORIES // 4)]
        rollout = submit(client, headers, {"job": "hold", "tasks": tasks, "group_size": 4})
        wait_for("episodes to run", lambda: client.get(f"/rollouts/{rollout}", headers=headers).json()["in_flight"])
        service: ServiceProcess = getattr(fleet, victim)
        service.kill(signal.SIGKILL)  # the process group: the proxy's workers too
        time.sleep(OUTAGE_S)
        # restarted as the fleet started it: with the fleet's secrets (every service authenticates)
        env = {**SECRETS.env(), **({"ROLLOUT_REDIS_URL": fleet.redis_url} if victim == "proxy" else {})}
        if victim == "broker":
            env["ROLLOUT_BROKER_TEMPLATE_ROOTS"] = tempfile.gettempdir()
        setattr(fleet, victim, restart(service, fleet.logs, env))
        wait_finished(client, headers, rollout, timeout_s=600)
        job = client.get("/jobs/hold", headers=headers).json()
    found = trajectories(fleet.redis_url, "hold")
    ids = Counter(t.trajectory_id for t in found)
    assert len(ids) == TRAJECTORIES  # none lost
    assert max(ids.values()) == 1  # none published twice
    assert Counter(t.status for t in found) == {Status.COMPLETED: TRAJECTORIES}  # no infra_error
    assert {t.reward for t in found} == {1.0}
    assert job["infra_error_rate"] == 0.0
    metrics = "\n".join(httpx.get(w.url + "/metrics").text for w in fleet.workers)
    assert f'rollout_worker_dependency_outages_total{{service="{victim}"}}' in metrics

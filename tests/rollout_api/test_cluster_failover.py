"""A Redis Cluster master killed (kill -9) while trajectories run: its replica is promoted and
every trajectory is accounted for by id. The cluster has 3 masters and 3 replicas (the embedded
valkey); the job's slot lives on the master that is killed. Every trajectory ends in the job's
stream exactly once (completed, or an infra_error record that names it), none silently missing,
none twice, and the rollout's own counts agree with the stream.

The size is ``ROLLOUT_TEST_FAILOVER_TRAJECTORIES`` (default 60 here; 300 is the size of the issue,
for a quiet machine: ``ROLLOUT_TEST_FAILOVER_TRAJECTORIES=300``)."""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.protocol import Status, keys
from services.runtime.redis_cluster import EmbeddedRedisCluster
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.backends.leftovers import remove_state_dir
from tests.rollout_api.fleet import (
    SUBMIT,
    Fleet,
    create_job,
    start_fleet,
    submit,
    task,
    trajectories,
    wait_finished,
    wait_for,
    write_script,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]
TRAJECTORIES = int(os.environ.get("ROLLOUT_TEST_FAILOVER_TRAJECTORIES", "60"))
GROUP = 4
JOB = "failover"
RULES: dict[str, list[Any]] = {
    "TASK-HOLD": [
        {"text": "```bash\necho 4 > a.txt\n```", "latency_s": 0.3},
        {"text": "```bash\necho 42 > answer.txt\n```", "latency_s": 0.3},
        {"text": SUBMIT, "latency_s": 0.3},
    ],  # fmt: skip
}


@pytest.fixture
def cluster() -> Iterator[EmbeddedRedisCluster]:
    with EmbeddedRedisCluster(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def fleet(tmp_path: Path, cluster: EmbeddedRedisCluster) -> Iterator[Fleet]:
    model = write_tokenizer_dir(tmp_path / "model")
    script = write_script(tmp_path / "script.json", RULES)
    state = Path(tempfile.mkdtemp(prefix="rollout-failover-"))
    state.chmod(0o755)  # the sandbox user must reach it
    fleet = start_fleet(cluster.url, script, model, tmp_path / "logs", state)
    try:
        yield fleet
    finally:
        fleet.stop()
        assert remove_state_dir(state) == [], "mounts leaked under the state dir"


def test_a_master_killed_under_load_loses_nothing_silently(fleet: Fleet, cluster: EmbeddedRedisCluster) -> None:
    with fleet.client() as client:
        headers = create_job(client, JOB)
        for _ in range(2):
            fleet.start_worker(jobs=[JOB], concurrency=24)
        tasks = [task(f"t{i}", f"TASK-HOLD {i}") for i in range(TRAJECTORIES // GROUP)]
        rollout = submit(client, headers, {"job": JOB, "tasks": tasks, "group_size": GROUP})
        path = f"/rollouts/{rollout}"
        wait_for("trajectories to finish", lambda: client.get(path, headers=headers).json()["finished"])
        at_kill = client.get(path, headers=headers).json()
        print(
            f"at the kill: {at_kill['finished']} finished, {at_kill['in_flight']} running, {at_kill['queued']} queued"
        )
        master = cluster.master_of(keys.work_stream(JOB))
        master.kill()
        killed_at = time.monotonic()
        promoted = cluster.wait_failover(keys.work_stream(JOB), master)
        print(f"replica {promoted.port} took over from {master.port} in {time.monotonic() - killed_at:.1f} s")
        status = wait_finished(client, headers, rollout, timeout_s=420)
    found = trajectories(cluster.url, JOB)  # a live seed (the fleet's may be the killed node)
    ids = Counter(f"{t.task_id}#{t.sample_index}" for t in found)
    expected = {f"t{i}#{s}" for i in range(TRAJECTORIES // GROUP) for s in range(GROUP)}
    print("statuses:", Counter(t.status.value for t in found), "attempts:", Counter(t.attempt for t in found))
    assert expected - set(ids) == set()  # none silently missing
    assert set(ids) - expected == set()
    assert max(ids.values()) == 1  # none twice
    assert status["finished"] == status["total"] == TRAJECTORIES
    assert {k: v for k, v in status["by_status"].items() if v} == dict(Counter(t.status.value for t in found))
    for traj in found:  # completed, or reported with its id and where it failed
        completed = traj.status is Status.COMPLETED and traj.reward == 1.0
        assert completed or (traj.status is Status.INFRA_ERROR and traj.infra is not None), traj

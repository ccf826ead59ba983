"""The end-to-end paths against a 3-master Redis Cluster: every service and the trainer's consumer
get a ``redis+cluster://`` URL (``ROLLOUT_REDIS_URL`` / ``--redis-url``) and nothing else changes.

The fleet is the one of ``test_e2e.py`` (real engines behind the proxy, the broker with local
sandboxes, the API, workers); the tests below are that module's own, collected here again so they
run with this module's ``fleet``. Together they use every Lua script (admit, take, give back,
publish), the transactions on a job's keys, consumer groups with XAUTOCLAIM, SSE reads, the
broker's lease scripts, and proxy membership over pub/sub, each on the node that owns the job's
hash slot. The jobs are spread so that their slots fall on different nodes (checked below).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.protocol import Status, keys
from services.runtime.redis_cluster import EmbeddedRedisCluster
from services.runtime.sync_redis import open_sync_redis
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.backends.leftovers import remove_state_dir
from tests.rollout_api.fleet import Fleet, create_job, start_fleet, submit, task, wait_finished, write_script
from tests.rollout_api.test_e2e import (  # noqa: F401  (collected again: they run on this module's fleet)
    RULES,
    client,
    test_cancel_stops_running_and_drops_queued,
    test_every_cap_truncates_with_its_name,
    test_group_of_four_over_several_tasks,
    test_worker_killed_mid_episode_loses_nothing,
    tokenizer,
)
from trainer_client.consumer import TrajectoryConsumer

# the first test's timeout also covers the fleet's start (7 processes, slow on a loaded machine)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
JOBS = ["batch", "caps", "crash", "cancel", "trainer"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_cluster: EmbeddedRedisCluster) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("cluster-fleet")
    model = write_tokenizer_dir(root / "model")
    script = write_script(root / "script.json", RULES)
    state = Path(tempfile.mkdtemp(prefix="rollout-cluster-e2e-"))
    state.chmod(0o755)  # the sandbox user must reach it
    redis_cluster.flush()
    fleet = start_fleet(redis_cluster.url, script, model, root / "logs", state)
    try:
        fleet.start_worker(jobs=["batch", "caps", "trainer"], concurrency=16)
        yield fleet
    finally:
        fleet.stop()
        assert remove_state_dir(state) == [], "mounts leaked under the state dir"


def test_the_jobs_live_on_different_nodes(redis_cluster: EmbeddedRedisCluster) -> None:
    """Not one node doing all the work: the jobs of this module hash to slots on every master."""
    cluster: Any = open_sync_redis(redis_cluster.url)
    try:
        nodes = {cluster.get_node_from_key(keys.work_stream(job)).port for job in JOBS}
    finally:
        cluster.close()
    assert nodes == {node.port for node in redis_cluster.nodes}


def test_the_trainers_consumer_reads_acks_and_reclaims(fleet: Fleet) -> None:
    """The trainer's consumer group on the cluster: read every record, a restart reclaims what was
    not acknowledged, acknowledged entries stay acknowledged."""
    with fleet.client() as http:
        headers = create_job(http, "trainer")
        tasks = [task("solve", "TASK-SOLVE t"), task("wrong", "TASK-WRONG t")]
        wait_finished(http, headers, submit(http, headers, {"job": "trainer", "tasks": tasks, "group_size": 3}))
    first = TrajectoryConsumer(open_sync_redis(fleet.redis_url), "trainer", consumer="trainer-0")
    first.ensure_group()
    entries = first.read(count=100, block_ms=1000)
    assert len(entries) == 6 and all(e.trajectory and e.trajectory.status is Status.COMPLETED for e in entries)
    assert first.ack([e.entry_id for e in entries[:4]]) == 4
    restarted = TrajectoryConsumer(open_sync_redis(fleet.redis_url), "trainer", consumer="trainer-1")
    reclaimed = restarted.reclaim()
    assert [e.entry_id for e in reclaimed] == [e.entry_id for e in entries[4:]]
    assert restarted.ack(e.entry_id for e in reclaimed) == 2
    assert restarted.pending_count() == 0 and restarted.read(count=10, block_ms=100) == []
    for consumer in (first, restarted):
        consumer.client.close()

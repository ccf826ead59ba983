"""The docker backend after a Redis that came back empty (issue 29): the broker removes the
containers labelled as its own whose leases the store lost, and nothing of it is left after its
stop. On a private dockerd (skipped where it cannot start)."""

from __future__ import annotations

import time

import docker
import httpx
import pytest
import redis

from tests.sandbox_broker.conftest import BrokerFactory, docker_env, lease, run
from tests.sandbox_broker.dockerd import IMAGE, Dockerd

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FAST_REAPER = {"ROLLOUT_BROKER_REAP_INTERVAL_S": "0.2", "ROLLOUT_BROKER_ORPHAN_INTERVAL_S": "0.5"}


def _ours(engine: docker.DockerClient) -> set[str]:
    """The broker's containers, in one list call: ``containers.list`` inspects each listed container
    after the list, and one the reaper removed in between raised NotFound."""
    return {c["Id"] for c in engine.api.containers(all=True, filters={"label": "rollout.broker=b1"})}


def test_docker_containers_whose_leases_the_store_lost_are_removed(
    dockerd: Dockerd, start_broker: BrokerFactory, redis_client: redis.Redis
) -> None:
    engine = docker.DockerClient(base_url=dockerd.url)
    unrelated = engine.containers.create(IMAGE, ["sleep", "1000"])  # not the broker's: never touched
    broker = start_broker("--backend", "docker", env=docker_env(dockerd, **FAST_REAPER))
    try:
        with httpx.Client(base_url=broker.url, timeout=60) as client:
            held = [lease(client, job="vanished") for _ in range(2)]
            assert run(client, held[0]["id"], "echo up")["stdout"] == "up\n"
            assert _ours(engine) == {h["sandbox_id"] for h in held}
            redis_client.flushall()  # Redis restarted empty

            deadline = time.monotonic() + 60  # a bound for a test that would hang, not a timing
            while _ours(engine) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _ours(engine) == set()
            assert client.get("/healthz").json()["store_lost"]["times"] == 1
            kept = lease(client, job="new")  # leased after the loss: kept until released
            assert run(client, kept["id"], "echo ok")["stdout"] == "ok\n"
            redis_client.delete(*redis_client.keys("*lease:" + kept["id"]))  # its record lost too, then the stop
        broker.stop()
        assert _ours(engine) == set() and unrelated.id in {c.id for c in engine.containers.list(all=True)}
    finally:
        unrelated.remove(force=True)
        engine.close()

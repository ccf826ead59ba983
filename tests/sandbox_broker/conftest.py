"""Brokers as real subprocesses on loopback, over real Redis and real bubblewrap sandboxes."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from services.sandbox_broker.backends.docker_firewall import chain_of
from services.sandbox_broker.backends.leftovers import remove_sandboxes, remove_state_dir
from tests.sandbox_broker.dockerd import IMAGE, Dockerd, private_dockerd, runsc_problem
from tests.sandbox_broker.recording import InProcessFactory, in_process_brokers
from tests.support.processes import ServiceProcess, start_service

BrokerFactory = Callable[..., ServiceProcess]

# Most broker tests are about sandboxes, not tokens: their brokers run in the development mode
# (no token = admin). tests/sandbox_broker/test_auth.py starts brokers with real tokens.
DEV_ENV = {"ROLLOUT_BROKER_ALLOW_ANONYMOUS": "true", "ROLLOUT_BROKER_TEMPLATE_ROOTS": tempfile.gettempdir()}

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def broker_args(redis_url: str, state_dir: Path, instance: str, *extra: str) -> list[str]:
    return ["-m", "services.cli", "broker", "--port", "{port}", "--redis-url", redis_url,
            "--state-dir", str(state_dir), "--instance", instance, *extra]  # fmt: skip


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """Under /tmp, not pytest's root-only tmp dir: the sandbox uid must be able to reach it."""
    path = Path(tempfile.mkdtemp(prefix="rollout-broker-test-"))
    path.chmod(0o711)
    yield path
    remove_sandboxes(path / "fake-e2b")  # the e2b fake's own local sandboxes, if a test started it
    assert remove_state_dir(path) == [], "mounts leaked under the state dir"


@pytest.fixture
def start_broker(redis_url: str, state_dir: Path, service_logs: Path) -> Iterator[BrokerFactory]:
    """Start brokers (stopped at the end, also on failure); env vars configure each one."""
    started: list[ServiceProcess] = []

    def start(*extra: str, instance: str = "b1", env: dict[str, str] | None = None) -> ServiceProcess:
        service = start_service(broker_args(redis_url, state_dir, instance, *extra), log_dir=service_logs,
                                env={**DEV_ENV, **(env or {})}, name=f"broker-{instance}", timeout_s=60)  # fmt: skip
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture
async def make_broker(redis_url: str) -> AsyncIterator[InProcessFactory]:
    """Brokers in-process over real Redis, on a backend that records calls (``recording.py``)."""
    async with in_process_brokers(redis_url) as make:
        yield make


def lease(client: httpx.Client, **body: object) -> dict[str, Any]:
    response = client.post("/leases", json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def run(client: httpx.Client, lease_id: object, shell: str, **body: object) -> dict[str, Any]:
    response = client.post(f"/leases/{lease_id}/exec", json={"shell": shell, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _iptables_chains() -> set[str]:
    chains: set[str] = set()
    for table in ("filter", "nat"):
        out = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False).stdout
        chains |= {f"{table}:{line.split()[1]}" for line in out.splitlines() if line.startswith("-N")}
    return chains


def _own_chains(daemon: Dockerd, since: float) -> set[str]:
    """The firewall chains (``docker_firewall.chain_of``) of every network this daemon had since ``since``,
    removed or not: another test file's dockerd, running beside this one, makes and drops chains of its own."""
    client = docker.DockerClient(base_url=daemon.url, timeout=30)
    try:
        created = client.events(since=int(since), until=int(time.time()) + 1, decode=True,
                                filters={"type": "network", "event": "create"})  # fmt: skip
        bridges = {f"br-{event['Actor']['ID'][:12]}" for event in created}
        for network in client.networks.list():
            named = network.attrs.get("Options", {}).get("com.docker.network.bridge.name")
            bridges.add(named or f"br-{network.id[:12]}")
    finally:
        client.close()
    return {f"{table}:{chain_of(bridge)}" for bridge in bridges for table in ("filter", "nat")}


@contextlib.contextmanager
def _checked_dockerd(runtimes: dict[str, list[str]] | None = None) -> Iterator[Dockerd]:
    """A private dockerd (skips where it cannot start); no iptables chain of its networks left after."""
    since = time.time()  # its networks, hence their chains, are all newer than this
    with private_dockerd(runtimes=runtimes) as daemon:
        if isinstance(daemon, str):
            pytest.skip(daemon)
        yield daemon
        own = _own_chains(daemon, since)
    assert _iptables_chains() & own == set()


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    """A private dockerd for the module (skips where it cannot start); nothing of it left in iptables after."""
    with _checked_dockerd() as daemon:
        yield daemon


# gVisor as an OCI runtime of the engine. Its default network mode (its own netstack) refuses to
# start on a host whose PID 1 network namespace it cannot read ("cannot run with network enabled in
# root network namespace"), so here it runs with --network=host: the container's own network
# namespace (docker's veth on the sandbox bridge, or loopback only) through the host's stack.
RUNSC = {"runsc": ["/usr/bin/runsc", "--network=host"]}


@pytest.fixture(scope="module")
def runsc_dockerd() -> Iterator[Dockerd]:
    """A private dockerd offering gVisor (``runsc``, apt-get install runsc) as a runtime."""
    if problem := runsc_problem():
        pytest.skip(problem)
    with _checked_dockerd(RUNSC) as daemon:
        yield daemon


def docker_env(daemon: Dockerd, **extra: str) -> dict[str, str]:
    return {"ROLLOUT_BROKER_DOCKER_HOST": daemon.url, "ROLLOUT_BROKER_DOCKER_IMAGE": IMAGE,
            "ROLLOUT_BROKER_DOCKER_EXEC_ROOT": daemon.exec_root, **extra}  # fmt: skip

"""The escape suite: attacks run inside sandboxes of both network modes on the local and docker
backends (escape.py has the probes). Every probe must be blocked and the broker healthy afterwards."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.sandbox_broker.backends import docker_firewall
from tests.sandbox_broker import escape
from tests.sandbox_broker.conftest import BrokerFactory, docker_env, lease, needs_bwrap, run
from tests.sandbox_broker.dockerd import Dockerd, runsc_problem
from tests.support.processes import ServiceProcess

pytestmark = [pytest.mark.slow]


@pytest.fixture
def canary() -> Iterator[Path]:
    """A host file no sandbox may change (outside /tmp, which every sandbox has its own of)."""
    path = Path("/var/tmp") / f"rollout-escape-canary-{secrets.token_hex(4)}"
    path.write_text("host\n")
    yield path
    assert path.read_text() == "host\n", "a sandbox wrote a host file"
    path.unlink()


@pytest.fixture
def services() -> Iterator[tuple[int, int]]:
    """Stand-ins for the platform's services: one on loopback only, one on every host address."""
    with ExitStack() as stack:
        yield stack.enter_context(escape.marker_service("127.0.0.1")), stack.enter_context(escape.marker_service(""))


def _targets(broker: ServiceProcess, redis_url: str, ports: tuple[int, int]) -> escape.Targets:
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    return escape.Targets(escape.host_ip(), ports[0], ports[1], broker.port, redis_port)


def _escapes(result: dict[str, Any]) -> list[str]:
    return [line for line in result["stdout"].splitlines() if line.startswith("ESCAPED")]


def _attack(client: httpx.Client, lid: str, script: str, timeout_s: float = 60) -> list[str]:
    return _escapes(run(client, lid, script, timeout_s=timeout_s))


def _exhaust(client: httpx.Client, lid: str, memory_mb: int, disk_mb: int, disk_dir: str) -> list[str]:
    """Fork bomb, memory and disk exhaustion; afterwards the sandbox still runs commands."""
    found = _attack(client, lid, escape.FORK_BOMB, timeout_s=30)
    found += _attack(client, lid, escape.MEMORY.format(mb=memory_mb * 3))
    disk = run(client, lid, escape.DISK.format(dir=disk_dir, half=disk_mb * 2 // 3, mb=disk_mb), timeout_s=60)
    found += _escapes(disk)
    assert "No space left" in disk["stdout"] + disk["stderr"], disk
    assert run(client, lid, "rm -f " + disk_dir + "/fill-*; echo alive")["stdout"] == "alive\n"
    return found


@needs_bwrap
@pytest.mark.timeout(300)  # gVisor's cold starts and exhaustion probes on a loaded host
@pytest.mark.parametrize("level", ["namespaces", "gvisor"])
@pytest.mark.parametrize("network", ["none", "egress"])
def test_local_sandbox_escapes_are_blocked(
    network: str, level: str, start_broker: BrokerFactory, redis_url: str, services: tuple[int, int], canary: Path
) -> None:
    if level == "gvisor" and (problem := runsc_problem()):
        pytest.skip(problem)
    broker = start_broker()
    targets = _targets(broker, redis_url, services)
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        isolation = client.get("/healthz").json()["isolation"]
        if network == "egress" and isolation["egress"] != "slirp4netns+nftables":
            pytest.skip(f"egress cannot be isolated here: {isolation['egress']}")
        resources = {"memory_mb": 128, "disk_mb": 64, "cpus": 1}
        lid = lease(client, network=network, resources=resources, isolation=level)["id"]
        if level == "gvisor":
            assert run(client, lid, "uname -r")["stdout"] == "4.4.0\n"  # gVisor's kernel, not the host's
        found = _attack(client, lid, escape.connect_script(targets, escape.BASH_CONNECT))
        found += _attack(client, lid, escape.host_script(broker.proc.pid, str(canary)) + "\n" + escape.READ_ONLY_HOST)

        other = lease(client, network=network, isolation=level)["id"]  # another sandbox: its files, /tmp
        run(client, other, "echo secret > /workspace/secret; echo secret > /tmp/secret")
        found += _attack(client, lid, "cat /workspace/secret /tmp/secret 2>/dev/null | sed 's/^/ESCAPED /'")

        if isolation["disk_quota"] == "loop-ext4":
            found += _exhaust(client, lid, 128, 64, "/workspace")
        assert found == []
        assert client.get("/healthz").status_code == 200
        assert run(client, lease(client)["id"], "echo fine")["stdout"] == "fine\n"


@needs_bwrap
@pytest.mark.parametrize("level", ["namespaces", "gvisor"])
def test_local_egress_reaches_allow_listed_destinations_only(
    level: str, start_broker: BrokerFactory, services: tuple[int, int]
) -> None:
    """The positive control: the path through NAT works, and the rules are what blocks the host."""
    if level == "gvisor" and (problem := runsc_problem()):
        pytest.skip(problem)
    broker = start_broker()
    host, any_port = escape.host_ip(), services[1]
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        if client.get("/healthz").json()["isolation"]["egress"] != "slirp4netns+nftables":
            pytest.skip("egress cannot be isolated here")
        template = {"name": "allowed", "egress_allow": [f"{host}:{any_port}"], "isolation": level}
        assert client.post("/templates", json=template).status_code == 201
        bad = client.post("/templates", json={"name": "bad", "egress_allow": ["not-an-address"]})
        assert bad.status_code in (400, 422), bad.text
        lid = lease(client, template="allowed", network="egress")["id"]
        # The allowed probe may be tried three times (a greeting relayed late by a loaded NAT is
        # not what this test is about); the blocked one is tried once and must print nothing.
        allowed = f'for _ in 1 2 3; do out=$(probe {host} {any_port}); case "$out" in *{escape.MARKER}*) break;; esac; '
        allowed += "done"
        script = f'probe() {{ {escape.BASH_CONNECT}; }}; {allowed}; echo "$out"; probe {host} {services[0]}'
        out = run(client, lid, script)["stdout"]
        assert escape.MARKER in out and out.count(escape.MARKER) == 1  # only the allow-listed port
        resolv = run(client, lid, "cat /etc/resolv.conf")["stdout"]
        assert resolv.startswith("nameserver 10.0.2.3")


@pytest.mark.docker
@pytest.mark.parametrize("network", ["none", "egress"])
def test_docker_sandbox_escapes_are_blocked(
    network: str,
    dockerd: Dockerd,
    start_broker: BrokerFactory,
    redis_url: str,
    services: tuple[int, int],
    canary: Path,
) -> None:
    broker = start_broker("--backend", "docker", env=docker_env(dockerd, ROLLOUT_BROKER_DOCKER_FIREWALL="true"))
    _docker_escapes(network, broker, redis_url, services, canary)


@pytest.mark.docker
@pytest.mark.parametrize("network", ["none", "egress"])
def test_gvisor_docker_sandbox_escapes_are_blocked(
    network: str,
    runsc_dockerd: Dockerd,
    start_broker: BrokerFactory,
    redis_url: str,
    services: tuple[int, int],
    canary: Path,
) -> None:
    """The same probes with gVisor as the engine's runtime (``docker_runtime=runsc``)."""
    env = docker_env(runsc_dockerd, ROLLOUT_BROKER_DOCKER_FIREWALL="true", ROLLOUT_BROKER_DOCKER_RUNTIME="runsc")
    broker = start_broker("--backend", "docker", env=env)
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        assert client.get("/healthz").json()["isolation"]["runtime"] == "runsc"
        assert run(client, lease(client)["id"], "uname -r")["stdout"] == "4.4.0\n"  # gVisor's kernel, not the host's
    _docker_escapes(network, broker, redis_url, services, canary, exhaust=False)


def _docker_escapes(
    network: str, broker: ServiceProcess, redis_url: str, services: tuple[int, int], canary: Path, exhaust: bool = True
) -> None:
    targets = _targets(broker, redis_url, services)
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        bridge = client.get("/healthz").json()["isolation"]["bridge"]
        assert docker_firewall.installed(bridge) and docker_firewall.installed6(bridge)  # before any probe
        resources = {"memory_mb": 128, "disk_mb": 64, "cpus": 1}
        lid = lease(client, network=network, resources=resources)["id"]
        connect = escape.connect_script(targets, escape.BUSYBOX_CONNECT, escape.GATEWAY)
        found = _attack(client, lid, connect)
        found += _attack(client, lid, escape.host_script(broker.proc.pid, str(canary)))

        other = lease(client, network=network)
        run(client, other["id"], "echo secret > /workspace/secret")
        found += _attack(client, lid, "cat /workspace/secret 2>/dev/null | sed 's/^/ESCAPED /'")
        if network == "egress":  # inter-container traffic: the other sandbox serves, this one connects
            serve = "(echo " + escape.MARKER + " | nc -l -p 7777 &) ; sleep 0.3; ip -o -4 addr show eth0"
            other_ip = run(client, other["id"], serve, keep_background=True)["stdout"].split()[3].split("/")[0]
            assert "nc -l -p 7777" in run(client, other["id"], "ps -o args")["stdout"]  # kept: spared by sweeps
            found += _attack(client, lid, f"nc -w 2 {other_ip} 7777 2>&1 | sed -n 's/^{escape.MARKER}/ESCAPED &/p'")

        run(client, lid, "sleep 300 & setsid sleep 301 & (sleep 302 &); echo started")
        left = run(client, lid, "ps -o pid,args | grep -c 'sleep 30[0-2]$'")["stdout"].strip()
        assert left == "0", "background processes outlived their command"
        if exhaust:  # not on gVisor's ptrace platform: a fork bomb there starves the sandbox's commands
            found += _exhaust(client, lid, 128, 64, "/tmp")
        assert found == []
        assert client.get("/healthz").status_code == 200
        assert run(client, lease(client)["id"], "echo fine")["stdout"] == "fine\n"

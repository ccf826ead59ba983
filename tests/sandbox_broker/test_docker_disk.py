"""disk_mb on the docker backend (backends/docker_disk.py): enforced by an engine whose storage
driver can (a private dockerd on a loop-mounted btrfs), and never silently ignored by one that
cannot (the plain private dockerd: overlay2 on the host's filesystem)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from services.sandbox_broker.backends import docker_disk
from tests.sandbox_broker.conftest import RUNSC, BrokerFactory, docker_env, lease, run
from tests.sandbox_broker.dockerd import Dockerd, private_dockerd, runsc_problem

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def btrfs_dockerd() -> Iterator[Dockerd]:
    with private_dockerd(btrfs_mb=2048, runtimes=RUNSC if not runsc_problem() else None) as daemon:
        if isinstance(daemon, str):
            pytest.skip(daemon)
        yield daemon


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_disk_mb_is_enforced_on_a_btrfs_engine(
    runtime: str, btrfs_dockerd: Dockerd, start_broker: BrokerFactory
) -> None:
    """Also under gVisor: its gofer writes the container's layer on the host, inside the qgroup."""
    if runtime == "runsc" and (problem := runsc_problem()):
        pytest.skip(problem)
    env = docker_env(btrfs_dockerd, ROLLOUT_BROKER_DOCKER_DISK_QUOTA="require", ROLLOUT_BROKER_DOCKER_RUNTIME=runtime)
    broker = start_broker("--backend", "docker", env=env)
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        assert client.get("/healthz").json()["isolation"]["disk_quota"].startswith("btrfs")
        assert "rollout_broker_disk_quota_enforced 1.0" in client.get("/metrics").text
        held = lease(client, job="dj", resources={"disk_mb": 64})
        filled = run(client, held["id"], "dd if=/dev/zero of=/workspace/fill bs=1M count=200; ls -l /workspace/fill")
        assert "Disk quota exceeded" in filled["stderr"], filled
        assert int(filled["stdout"].split()[4]) < 64 << 20  # the file stopped at the limit
        roomy = lease(client, job="dj", resources={"disk_mb": 512})
        assert run(client, roomy["id"], "dd if=/dev/zero of=/workspace/fill bs=1M count=200")["exit_code"] == 0
        for item in (held, roomy):
            assert client.delete(f"/leases/{item['id']}").status_code == 204


def test_an_engine_that_cannot_says_so_or_is_refused(dockerd: Dockerd, start_broker: BrokerFactory) -> None:
    broker = start_broker("--backend", "docker", env=docker_env(dockerd))
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        quota = client.get("/healthz").json()["isolation"]["disk_quota"]
        assert quota.startswith("none: the engine's storage driver overlay2"), quota
        assert "rollout_broker_disk_quota_enforced 0.0" in client.get("/metrics").text
    broker.stop()
    with pytest.raises(RuntimeError, match="exited"):
        start_broker(
            "--backend", "docker", instance="b2", env=docker_env(dockerd, ROLLOUT_BROKER_DOCKER_DISK_QUOTA="require")
        )


def test_probe_reads_the_storage_driver() -> None:
    assert docker_disk.probe({"Driver": "btrfs"}, "auto").options(64) == {"storage_opt": {"size": "64M"}}
    xfs = docker_disk.probe({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]}, "auto")
    assert xfs.enforced
    ext4 = docker_disk.probe({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}, "auto")
    assert not ext4.enforced and ext4.options(64) == {} and "overlay2 on extfs" in ext4.detail
    assert not docker_disk.probe({"Driver": "btrfs"}, "off").enforced
    with pytest.raises(RuntimeError, match="require"):
        docker_disk.probe({"Driver": "vfs"}, "require")

"""The launch namespace (backends/launch_ns.py): sandboxes start from a mount namespace that holds
the host's mounts and the sandboxes starting at that moment, not every live sandbox's mounts."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.protocol.sandboxes import ExecRequest, Resources
from services.sandbox_broker.backends import launch_ns, mounts
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.launch_ns import BRIEF_LAUNCHES, LaunchNamespace
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.backends.local_commands import HOST_PYTHON
from services.sandbox_broker.metrics import LaunchCollector
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launch namespace needs a root broker")


def holder_points(space: LaunchNamespace) -> list[str]:
    """The mount points of the launch namespace, read from its holder's mount table."""
    assert space.proc is not None
    with open(f"/proc/{space.proc.pid}/mountinfo") as table:
        return [line.split(" ")[4] for line in table if line.strip()]


async def held(space: LaunchNamespace, under: Path) -> list[str]:
    """The launch namespace's mount points under ``under`` once the detaches sent are taken (a
    detach is a message the holder takes within microseconds: waited for up to a second)."""
    for _ in range(50):
        if not (points := [p for p in holder_points(space) if p.startswith(str(under))]):
            break
        await asyncio.sleep(0.02)
    return points


def gauges(space: LaunchNamespace) -> dict[str, float]:
    """What the broker's /metrics says of the launch namespace now."""
    return {family.name: family.samples[0].value for family in LaunchCollector(space).collect()}


def read(path: Path) -> str:
    return path.read_text()


def tmpfs(point: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], check=True)


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[Path]:
    """Three sandbox directories, each with a tmpfs at rw/ (as a loop-mounted disk would be)."""
    root = tmp_path / "sandboxes"
    for name in ("s0", "s1", "s2"):
        (root / name / "rw").mkdir(parents=True)
        tmpfs(root / name / "rw")
    yield root
    for point in mounts.points_under(root):
        mounts.detach(point)


def test_the_launch_namespace_holds_a_sandbox_only_while_it_starts(sandboxes: Path) -> None:
    async def scenario() -> None:
        space = LaunchNamespace(sandboxes, HOST_PYTHON)
        space.start()
        try:
            assert space.problem == "" and space.path is not None
            # the sandboxes' mounts that were up when it started are not in it
            assert not [p for p in holder_points(space) if p.startswith(str(sandboxes))]
            (sandboxes / "s0" / "rw" / "seen").write_text("from the host")
            async with space.attached(sandboxes / "s0", brief=True) as first:
                async with space.attached(sandboxes / "s0", brief=False) as second:  # shared: one attach
                    assert first == second == space.path
                    inside = [p for p in holder_points(space) if p.startswith(str(sandboxes))]
                    assert sorted(inside) == [str(sandboxes / "s0"), str(sandboxes / "s0" / "rw")]
                    assert gauges(space) == {"rollout_broker_launch_namespace": 1.0,
                                             "rollout_broker_agent_start_limit": float(BRIEF_LAUNCHES),
                                             "rollout_broker_agent_starts": 1.0,  # the brief one only
                                             "rollout_broker_launch_namespace_sandboxes": 1.0}  # fmt: skip
                    # the same filesystem: what the host wrote is there, through the launch namespace
                    assert first is not None and space.proc is not None
                    # (its holder's root, in its namespace: there the host's own mount is not)
                    assert read(Path(f"/proc/{space.proc.pid}/root{sandboxes}/s0/rw/seen")) == "from the host"
                assert [p for p in holder_points(space) if p.startswith(str(sandboxes))]  # still one user
            assert await held(space, sandboxes) == []
            assert gauges(space)["rollout_broker_agent_starts"] == 0
            assert gauges(space)["rollout_broker_launch_namespace_sandboxes"] == 0
            # a mount the host makes later does not reach it
            (sandboxes / "s3" / "rw").mkdir(parents=True)
            tmpfs(sandboxes / "s3" / "rw")
            assert str(sandboxes / "s3" / "rw") in mounts.mount_points()
            assert not [p for p in holder_points(space) if p.startswith(str(sandboxes))]
        finally:
            space.close()

    asyncio.run(scenario())


def test_the_launch_namespace_leaves_out_the_hosts_kernel_filesystems(sandboxes: Path) -> None:
    """/sys and the mounts below /proc and /dev are not copied into every bubblewrap's namespace;
    the root, /proc and /dev themselves are (bubblewrap reads /proc and binds nodes from /dev)."""
    host = mounts.mount_points()
    assert any(p == "/sys" or p.startswith(("/sys/", "/proc/", "/dev/")) for p in host)  # something to leave out
    space = LaunchNamespace(sandboxes, HOST_PYTHON)
    space.start()
    try:
        points = holder_points(space)
        assert not [p for p in points if p == "/sys" or p.startswith(("/sys/", "/proc/", "/dev/"))]
        assert {"/", "/proc", "/dev"} <= set(points)
        # the host's other mounts all stay: those there before the namespace was made and still there after
        # it (other tests' brokers mount and unmount their probes meanwhile; one such mount failed this once)
        lasting = set(host) & set(mounts.mount_points())
        kept = [p for p in lasting if not (p == "/sys" or p.startswith(("/sys/", "/proc/", "/dev/", str(sandboxes))))]
        assert set(kept) <= set(points)
    finally:
        space.close()


def test_a_dead_holder_means_launches_from_the_brokers_namespace_then_a_new_holder(sandboxes: Path) -> None:
    async def scenario() -> None:
        space = LaunchNamespace(sandboxes, HOST_PYTHON)
        space.start()
        try:
            assert space.proc is not None
            dead = space.proc
            dead.kill()
            dead.wait()  # reaped here only to know it ended; the namespace reaps its own at close
            async with space.attached(sandboxes / "s1", brief=True) as mount_ns:
                assert mount_ns is None  # the broker's own: the launch goes on
            assert space.proc is not None and space.proc is not dead and space.proc.poll() is None
            async with space.attached(sandboxes / "s1", brief=True) as mount_ns:
                assert mount_ns == f"/proc/{space.proc.pid}/ns/mnt"
                assert str(sandboxes / "s1" / "rw") in holder_points(space)
        finally:
            space.close()
        assert space.proc is None and not space.dead

    asyncio.run(scenario())


@needs_bwrap
def test_sandboxes_start_from_the_launch_namespace_and_leave_it(state_dir: Path) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(state_dir=state_dir)
        backend = LocalBackend(settings)
        found = await backend.start()
        try:
            if backend.launch is None or backend.launch.problem:
                pytest.skip(f"no launch namespace here: {found.get('launch_namespace')}")
            assert found["launch_namespace"].startswith("own mount namespace")
            spec = SandboxSpec(default_template(settings), Resources())
            first, second = [await backend.create(spec) for _ in range(2)]
            assert backend.agents.agents[first.sandbox_id].alive  # started from it
            host = mounts.mount_points()
            assert [p for p in host if p.startswith(str(backend.root))]  # their disks, on the host
            assert await held(backend.launch, backend.root) == []

            async def sh(sid: str, command: str) -> str:
                result = await backend.exec(sid, ExecRequest(shell=command, timeout_s=20))
                assert result.exit_code == 0, result.stderr
                return result.stdout

            await sh(first.sandbox_id, "echo mine > /workspace/f")
            # the agent is busy with the first: the second command starts a bubblewrap of its own there
            _, alone = await asyncio.gather(sh(first.sandbox_id, "sleep 1"), sh(first.sandbox_id, "cat /workspace/f"))
            assert alone == "mine\n"
            assert await sh(second.sandbox_id, "ls /workspace") == ""  # its own disk, not the first's
            assert await held(backend.launch, backend.root) == []
            for sandbox in (first, second):
                await backend.destroy(sandbox.sandbox_id)
            assert not [p for p in mounts.mount_points() if p.startswith(str(backend.root))]
        finally:
            await backend.close()

    asyncio.run(scenario())


def test_without_the_new_mount_api_launches_stay_in_the_brokers_namespace(
    sandboxes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_open_tree(path: Path) -> int:
        raise OSError(errno.ENOSYS, f"open_tree({path}): Function not implemented")

    monkeypatch.setattr(launch_ns, "clone_tree", no_open_tree)

    async def scenario() -> None:
        space = LaunchNamespace(sandboxes, HOST_PYTHON)
        space.start()
        try:
            assert "open_tree" in space.problem and "Function not implemented" in space.problem
            assert space.proc is None and space.path is None  # its holder ended at once
            assert gauges(space)["rollout_broker_launch_namespace"] == 0
            async with space.attached(sandboxes / "s0", brief=True) as mount_ns:
                assert mount_ns is None
        finally:
            space.close()

    asyncio.run(scenario())

"""Exec agents forked from the zygote (backends/agent_zygote.py): a command run through one sees the
same process identity, limits, namespaces and mounts as one run through a bubblewrap of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.protocol.sandboxes import ExecRequest, Resources
from services.sandbox_broker.backends.agent_zygote import Zygote
from services.sandbox_broker.backends.agents import ExecAgent
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.backends.zygote_client import AgentZygote, Spawned, only_child
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = needs_bwrap

NAMESPACES = "cgroup ipc mnt net pid user uts"
# what a command is and may do: ids, capabilities, no new privileges, limits (no core dumps: soft and
# hard), cgroups, host name, mount points, no further user namespace
PROBE = (
    "grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' /proc/self/status; ulimit -a; echo core $(ulimit -Sc) "
    "$(ulimit -Hc); cat /proc/self/cgroup; "
    "hostname; cut -d' ' -f5 /proc/self/mountinfo; unshare -U true 2>/dev/null && echo NESTED-USERNS; "
    "cat /proc/sys/user/max_user_namespaces"
)


@contextlib.asynccontextmanager
async def zygote_backend(
    state_dir: Path, ignored: tuple[signal.Signals, ...] = ()
) -> AsyncIterator[tuple[BrokerSettings, LocalBackend, AgentZygote]]:
    """A started local backend whose agents the zygote forks (skipped where it cannot: not root);
    ``ignored``: signals this process ignores while the backend and its zygote start (what ``nohup``
    or a shell's background job hands a broker), restored after."""
    settings = BrokerSettings(state_dir=state_dir)
    backend = LocalBackend(settings)
    before = {number: signal.signal(number, signal.SIG_IGN) for number in ignored}
    try:
        await backend.start()
        if backend.agents.zygote is not None:
            await backend.agents.zygote.start()
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    try:
        if backend.agents.zygote is None:
            pytest.skip("the zygote needs a root broker")
        yield settings, backend, backend.agents.zygote
    finally:
        await backend.close()


def test_forked_agents_commands_are_isolated_as_a_bubblewraps(state_dir: Path) -> None:
    async def scenario() -> None:
        async with zygote_backend(state_dir) as (settings, backend, agents_zygote):
            sandbox = await backend.create(SandboxSpec(default_template(settings), Resources()))
            sid = sandbox.sandbox_id

            async def sh(command: str) -> str:
                result = await backend.exec(sid, ExecRequest(shell=command, timeout_s=20))
                assert result.exit_code == 0, result.stderr
                return result.stdout

            assert backend.agents.agents[sid].proc is not None and agents_zygote.proc is not None
            # the agent is busy with the first: the second runs through a bubblewrap of its own
            _, alone = await asyncio.gather(sh("sleep 1"), sh(PROBE))
            via_agent = await sh(PROBE)
            assert via_agent == alone
            assert "CapEff:\t0000000000000000" in via_agent and "CapBnd:\t0000000000000000" in via_agent
            assert "NoNewPrivs:\t1" in via_agent and "Uid:\t1000\t1000\t1000\t1000" in via_agent
            assert "NESTED-USERNS" not in via_agent and "core 0 0\n" in via_agent
            # every namespace of the agent's command is that of the sandbox's pid 1 (bubblewrap's stub)
            # but its cgroup namespace: the agent's own, rooted at the sandbox's cgroups (the stub's is
            # rooted where bubblewrap started); its view of them is a bubblewrap's (PROBE, above)
            same = '[ "$(readlink /proc/self/ns/$n)" = "$(readlink /proc/1/ns/$n)" ] || echo $n'
            assert await sh(f"for n in {NAMESPACES}; do {same}; done") == "cgroup\n"
            for name in NAMESPACES.split():  # and none is the host's
                host = os.readlink(f"/proc/self/ns/{name}")
                assert (await sh(f"readlink /proc/self/ns/{name}")).strip() != host
            assert (await sh("echo $PPID")).strip() not in ("0", "1")  # the agent, not the stub
            assert (await asyncio.gather(sh("sleep 1"), sh("echo $PPID")))[1] == "1\n"  # bubblewrap's init

            # a zygote that died is started again at the next sandbox's agent
            zygote = agents_zygote.proc
            zygote.kill()
            await zygote.wait()
            again = (await backend.create(SandboxSpec(default_template(settings), Resources()))).sandbox_id
            assert again in backend.agents.agents and agents_zygote.proc is not zygote
            assert (await backend.exec(again, ExecRequest(shell="echo $PPID", timeout_s=20))).stdout != "1\n"
        assert agents_zygote.proc is None

    asyncio.run(scenario())


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _zombies_of(pid: int) -> list[str]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [c for c in children if Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"]


def _read(path: str) -> str:
    return Path(path).read_text()


def _status(pid: int) -> dict[str, str]:
    return _status_of(Path(f"/proc/{pid}/status").read_text())


def _status_of(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _check_from_the_host(bubblewrap: int, cgroup_procs: list[Path], nofile: int, netns: Path) -> None:
    """The bubblewrap is the sandbox uid's, with no groups, no capability in any set and no new
    privileges, and its stub is in every cgroup of the sandbox (which the stub's own cgroup namespace
    hides), under its rlimits, in its egress namespace, with nothing open but its stdin and stdout
    (its stderr, the agent's log, closed once it is ready) and no signal blocked or ignored (glibc's
    posix_spawn leaves its two internal real-time signals ignored)."""
    assert Path(f"/proc/{bubblewrap}/exe").resolve() == Path(shutil.which("bwrap") or "bwrap").resolve()
    status = _status(bubblewrap)
    assert status["Uid"] == status["Gid"] == "1000\t1000\t1000\t1000" and status["Groups"].strip() == ""
    assert [status[f"Cap{kind}"] for kind in ("Inh", "Prm", "Eff", "Bnd", "Amb")] == ["0000000000000000"] * 5
    assert status["NoNewPrivs"] == "1"
    stub = only_child(bubblewrap)
    assert sorted(os.listdir(f"/proc/{stub}/fd")) == ["0", "1"]
    assert int(_status(stub)["SigBlk"], 16) == 0 and int(_status(stub)["SigIgn"], 16) & 0x7FFFFFFF == 0  # signals 1-31
    groups = Path(f"/proc/{stub}/cgroup").read_text()
    for procs in cgroup_procs:
        assert f"/{procs.parent.name}\n" in groups and str(stub) in procs.read_text().split()
    assert f"Max open files            {nofile}" in Path(f"/proc/{stub}/limits").read_text()
    assert os.stat(f"/proc/{stub}/ns/net").st_ino == os.stat(netns).st_ino


def test_the_zygote_starts_each_sandboxs_bubblewrap_in_its_cgroups_limits_and_namespaces(state_dir: Path) -> None:
    """The zygote's child does what the shell, nsenter and setpriv did before bubblewrap: the stub is in
    the sandbox's cgroups (which its own cgroup namespace hides), under its rlimits, in the egress
    namespace, as the sandbox uid; bubblewrap is the zygote's child; the broker watches it by pidfd, and
    the zygote reaps it."""

    async def scenario() -> None:
        # started as a background job under nohup: none of the three reaches the sandbox ignored
        async with zygote_backend(state_dir, (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)) as (
            settings, backend, agents_zygote,
        ):  # fmt: skip
            sandbox = await backend.create(SandboxSpec(default_template(settings), Resources(), network="egress"))
            sid = sandbox.sandbox_id
            agent, zygote = backend.agents.agents[sid], agents_zygote.proc
            assert isinstance(agent.proc, Spawned) and zygote is not None
            assert _parent(agent.proc.pid) == zygote.pid  # no shell, nsenter or setpriv left between them
            # the zygote started it from the sandbox's namespaces and ids and is back in its own; it
            # never joined the sandbox's cgroups (the stub was moved there)
            assert _read(f"/proc/{zygote.pid}/cgroup") == _read("/proc/self/cgroup")
            assert _status(zygote.pid)["Uid"] == _status(zygote.pid)["Gid"] == "0\t0\t0\t0"
            for name in ("net", "mnt", "pid_for_children"):
                assert os.readlink(f"/proc/{zygote.pid}/ns/{name}") == os.readlink(f"/proc/self/ns/{name}")
            _check_from_the_host(agent.proc.pid, backend.cgroups.procs_files(sid), backend.nofile,
                                 state_dir / "sandboxes" / sid / "netns")  # fmt: skip
            # the agent is the zygote's other child (no intermediate process), born in the stub's pid
            # namespace and in the sandbox's cgroups; the zygote's next children are born in its own
            forked = [c for c in _children(zygote.pid) if c != agent.proc.pid]
            stub = only_child(agent.proc.pid)
            assert len(forked) == 1
            assert os.readlink(f"/proc/{forked[0]}/ns/pid") == os.readlink(f"/proc/{stub}/ns/pid")
            assert os.readlink(f"/proc/{zygote.pid}/ns/pid_for_children") == os.readlink("/proc/self/ns/pid")
            for procs in backend.cgroups.procs_files(sid):
                assert str(forked[0]) in procs.read_text().split()
            result = await backend.exec(sid, ExecRequest(shell="cat /proc/self/status", timeout_s=20))
            assert "NoNewPrivs:\t1" in result.stdout and "CapBnd:\t0000000000000000" in result.stdout
            assert int(_status_of(result.stdout)["SigIgn"], 16) & 0x7FFFFFFF == 0  # the command's, too

            # bubblewrap killed: the broker sees it end (pidfd), the zygote reaps it, and the sandbox's
            # next command runs (alone) while a new agent starts, from the zygote again
            agent.proc.kill()
            await asyncio.wait_for(agent.proc.wait(), 10)
            assert not agent.alive
            assert (await backend.exec(sid, ExecRequest(shell="echo again", timeout_s=20))).stdout == "again\n"
            for _ in range(100):
                if sid in backend.agents.agents and backend.agents.agents[sid].alive:
                    break
                await asyncio.sleep(0.1)
            assert isinstance(backend.agents.agents[sid].proc, Spawned)
            for _ in range(100):
                if not _zombies_of(zygote.pid):
                    break
                await asyncio.sleep(0.1)
            assert _zombies_of(zygote.pid) == []

    asyncio.run(scenario())


def test_a_bubblewrap_the_zygote_cannot_start_fails_the_agent_not_the_zygote(state_dir: Path) -> None:
    async def scenario() -> None:
        async with zygote_backend(state_dir) as (settings, backend, zygote):
            await zygote.start()
            started = zygote.proc
            log_path = state_dir / "agent.log"
            launch = {"procs": [], "rlimits": {}, "namespaces": [], "uid": 1000, "sandbox": "nowhere"}
            with pytest.raises(OSError, match="did not start the sandbox's bubblewrap"):
                await ExecAgent.fork(zygote, [str(state_dir / "no-bwrap"), "--version"], {}, log_path, launch, "/")
            assert "zygote: the sandbox nowhere did not start: FileNotFoundError" in log_path.read_text()
            sandbox = await backend.create(SandboxSpec(default_template(settings), Resources()))
            assert isinstance(backend.agents.agents[sandbox.sandbox_id].proc, Spawned)
            assert zygote.proc is started and started is not None and started.returncode is None  # the same one

    asyncio.run(scenario())


@contextlib.contextmanager
def forked_stand_in() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A stand-in for a bubblewrap that dies while setting up: a parent whose child blocks on a pipe
    (as bubblewrap's waits on an eventfd for its uid map) with no parent-death signal; yields both,
    once the child is there."""
    code = (
        "import os, time\nr, w = os.pipe()\n"
        "if os.fork() == 0:\n    os.read(r, 1)\nelse:\n    print(flush=True)\n    time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"\n"  # forked
        yield parent, int(Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()[0])
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def _assert_both_killed(parent: subprocess.Popen[bytes], child: int) -> None:
    assert parent.wait(10) == -signal.SIGKILL
    for _ in range(100):
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists()  # killed, and reaped by init (its parent is gone)


def test_at_its_end_the_zygote_takes_every_bubblewrap_it_started_with_its_child() -> None:
    """At its end, the zygote kills each bubblewrap it started and its child (the Zygote's
    constructor is skipped: it would drop this process's capabilities)."""
    with forked_stand_in() as (parent, child):
        zygote = Zygote.__new__(Zygote)
        zygote.launched = {parent.pid, 2**22 + 7}  # and one that ended already
        zygote.end()
        _assert_both_killed(parent, child)


async def test_a_bubblewrap_the_broker_gave_up_on_goes_with_its_child() -> None:
    """The broker's end (``Spawned.take``), where a sandbox's start failed, timed out or was cancelled:
    its bubblewrap may still be setting up. The broker killed it alone by its pidfd, and a fresh-clone
    rehearsal found its child orphaned on its eventfd after the suite had ended."""
    with forked_stand_in() as (parent, child):
        spawned = Spawned(parent.pid, os.pidfd_open(parent.pid))
        spawned.take()
        await asyncio.wait_for(spawned.wait(), 10)
        _assert_both_killed(parent, child)
        spawned.take()  # ended: nothing to do


def test_a_bubblewrap_whose_broker_is_gone_goes_with_its_child() -> None:
    """A bubblewrap started for a broker that died (or gave up waiting) meanwhile: its reply cannot
    be sent, and the zygote kills it with its child. It killed the bubblewrap alone, and a rehearsal
    of the broker benchmark's kill -9 found the child orphaned on its eventfd minutes later."""
    with forked_stand_in() as (parent, child):
        zygote = Zygote.__new__(Zygote)
        zygote.launched = set()
        zygote.launch = lambda request, fds: parent.pid  # type: ignore[method-assign]
        ours, theirs = socket.socketpair()
        ours.close()  # the broker's end: gone
        with theirs, open(os.devnull, "rb") as stdin, open(os.devnull, "wb") as out:
            zygote.spawn(ours, {"sandbox": "gone"}, [stdin.fileno(), out.fileno(), out.fileno(), theirs.fileno()])
        _assert_both_killed(parent, child)

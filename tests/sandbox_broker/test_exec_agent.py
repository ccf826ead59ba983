"""The resident exec agent of local sandboxes (backends/exec_agent.py): commands run through one
long-lived process per sandbox, yet each keeps the semantics of a bubblewrap of its own: its leftovers
die with it, it cannot reach the agent's pipes, killing the agent only ends the command, and a second,
concurrent command runs beside it."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from services.protocol.sandboxes import ExecRequest, Resources
from services.sandbox_broker.backends import exec_agent, netns
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.backends.local_commands import HOST_PYTHON
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template
from tests.sandbox_broker.conftest import needs_bwrap
from tests.sandbox_broker.dockerd import runsc_problem

pytestmark = needs_bwrap


@pytest.mark.parametrize("level", ["namespaces", "gvisor"])
def test_commands_share_one_agent_and_keep_their_own_semantics(level: str, state_dir: Path) -> None:
    """Also in gVisor, where the agent is its container's first process, gVisor's root (its /proc
    does not honour non-dumpable: only another uid keeps the pipes out of reach), and polls for its
    command's exit (gVisor has no pidfd_open)."""
    if level == "gvisor" and (problem := runsc_problem()):
        pytest.skip(problem)

    async def scenario() -> None:
        settings = BrokerSettings(state_dir=state_dir)
        backend = LocalBackend(settings)
        await backend.start()
        sandbox = await backend.create(SandboxSpec(default_template(settings), Resources(), isolation=level))
        sid = sandbox.sandbox_id

        async def sh(command: str, **extra: object) -> tuple[int, str, str]:
            result = await backend.exec(sid, ExecRequest(shell=command, timeout_s=20, **extra))
            return result.exit_code, result.stdout, result.stderr

        agent = (await sh("echo $PPID"))[1]
        assert agent == (await sh("echo $PPID"))[1]  # one resident parent: not bwrap's init; gVisor's first
        assert (agent == "1\n") == (level == "gvisor")
        commands = (await sh("id -u; grep -E '^Cap(Eff|Prm)' /proc/self/status"))[1].split()
        assert commands == ["1000", "CapPrm:", "0000000000000000", "CapEff:", "0000000000000000"]
        assert sid in backend.agents.agents

        # background processes end with their command, setsid and double forks included
        assert (await sh("(setsid sleep 300 &); (sleep 301 &); sleep 302 & echo started"))[1] == "started\n"
        assert "sleep" not in (await sh("ps -eo args"))[1]
        timed = await backend.exec(sid, ExecRequest(shell="(setsid sleep 303 &); sleep 304", timeout_s=1))
        assert (timed.exit_code, timed.timed_out) == (124, True)
        assert "sleep" not in (await sh("ps -eo args"))[1]

        # the agent's pipes are out of reach (no forged answers), and killing it ends only the command
        forged = await sh(f"echo forged > /proc/{agent.strip()}/fd/1 && echo WROTE")
        assert forged[0] != 0 and "WROTE" not in forged[1] and "Permission denied" in forged[2]
        killed = 0 if level == "gvisor" else 137  # gVisor: the agent is init, and root there: out of reach
        assert (await sh("kill -9 -1; sleep 5"))[0] == killed
        assert await sh("echo alive; exit 3", stdin="x") == (3, "alive\n", "")

        # a second command while one runs gets a bubblewrap of its own; both finish
        both = await asyncio.gather(sh("sleep 1; echo one"), sh("echo two"))
        assert [b[:2] for b in both] == [(0, "one\n"), (0, "two\n")]

        await backend.destroy(sid)
        assert sid not in backend.agents.agents
        await backend.close()

    asyncio.run(scenario())


def test_egress_namespaces_open_past_fd_1024(tmp_path: Path) -> None:
    """Two pipes per agent: a broker with hundreds of sandboxes holds fds past select()'s 1024."""
    if netns.probe(tmp_path / "probe"):
        pytest.skip("no isolated egress on this host")
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        netns.open_namespace(tmp_path, netns.ruleset([], []))
    finally:
        netns.close_namespace(tmp_path)
        for fd in held:
            os.close(fd)


# the agent's own spawn, compared with subprocess.Popen in the interpreter the sandboxes run it on
_DRIVER = r"""
import json, os, sys
agent = {"__name__": "exec_agent"}
exec(compile(open(sys.argv[1]).read(), "exec_agent", "exec"), agent)
heavy = [m for m in ("json", "subprocess", "selectors", "signal", "typing", "re", "enum", "threading")
         if m in agent_modules] if (agent_modules := set(json.loads(sys.argv[2]))) else []
import subprocess

def via_agent(argv, env, cwd, stdin):
    child = agent["spawn"](argv, env, cwd, stdin is not None)
    if stdin is not None:
        os.write(child.stdin, stdin.encode()); os.close(child.stdin)
    out = b"".join(iter(lambda: os.read(child.stdout, 65536), b""))
    err = b"".join(iter(lambda: os.read(child.stderr, 65536), b""))
    os.close(child.stdout); os.close(child.stderr)
    return [child.wait(), out.decode(), err.decode()]

def via_popen(argv, env, cwd, stdin):
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, err = proc.communicate(stdin.encode() if stdin is not None else None)
    return [proc.returncode, out.decode(), err.decode()]

def outcome(run, *call):
    try:
        return run(*call)
    except OSError as exc:
        return ["OSError", exc.errno]

cases = json.loads(sys.argv[3])
fast = [outcome(via_agent, *c) for c in cases]
agent["_fork_exec"] = None  # the agent's Popen path (another interpreter version)
print(json.dumps({"heavy": heavy, "agent": fast, "agent_popen": [outcome(via_agent, *c) for c in cases],
                  "popen": [outcome(via_popen, *c) for c in cases]}))
"""


def test_the_agents_spawn_starts_commands_as_popen_does(tmp_path: Path) -> None:
    load = f"exec(open({exec_agent.__file__!r}).read(), {{'__name__': 'agent'}}); import sys; m = sorted(sys.modules)"
    loaded = subprocess.run([HOST_PYTHON, "-I", "-S", "-c", load + "; import json; print(json.dumps(m))"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "noexec").write_text("#!/bin/sh\necho never\n")  # not executable
    env = {"PATH": f"/nonexistent:{tmp_path / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    # the shell reads its own signal masks with builtins: a forked reader (grep) could see the mask
    # dash sets on itself for the moment of a fork, before it restores it
    masks = 'while read -r k v; do case $k in SigIgn:|SigBlk:) echo "$k $v";; esac; done </proc/$$/status'
    show = f'echo "$$ $(cut -d" " -f6 /proc/$$/stat) $(pwd)"; {masks}; ls /proc/$$/fd'
    cases = [
        (["sh", "-c", show], env, str(tmp_path), None),  # session, signals, descriptors, cwd
        (["sh", "-c", "cat; echo; cat </dev/stdin; exit 3"], env, "/", "piped in"),
        (["sh", "-c", "cat; echo end"], env, "/", None),  # /dev/null
        (["sh", "-c", "echo out; echo err >&2; kill -9 $$"], env, "/", None),
        (["true"], {"PATH": "/nonexistent:/bin"}, "/", None),  # found on the env's PATH
        (["no-such-command"], env, "/", None),
        (["noexec"], env, "/", None),  # EACCES reported, although later directories say ENOENT
        (["true"], env, str(tmp_path / "missing"), None),
        ([str(tmp_path / "bin" / "noexec")], env, "/", None),
    ]
    done = subprocess.run([HOST_PYTHON, "-I", "-S", "-c", _DRIVER, exec_agent.__file__, loaded, json.dumps(cases)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    found = json.loads(done.stdout)
    assert found["heavy"] == []  # its start stays cheap (the module docstring)
    runs = found["agent"], found["agent_popen"], found["popen"]
    for run in runs:
        pid_session = run[0][1].split()[:2]
        assert pid_session[0] == pid_session[1]  # a session of its own
        run[0][1] = run[0][1].split(" ", 2)[2]  # pids differ between the runs
    agent, agent_popen, popen = runs
    assert agent == popen and agent_popen == popen
    assert agent[5] == ["OSError", errno.ENOENT] and agent[6] == ["OSError", errno.EACCES]

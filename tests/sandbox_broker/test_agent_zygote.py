"""Exec agents forked from the zygote (backends/agent_zygote.py): a command run through one sees the
same process identity, limits, namespaces and mounts as one run through a bubblewrap of its own."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from services.protocol.sandboxes import ExecRequest, Resources
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = needs_bwrap

NAMESPACES = "cgroup ipc mnt net pid user uts"
# what a command is and may do: ids, capabilities, no new privileges, limits, cgroups, host name,
# mount points, no further user namespace
PROBE = (
    "grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' /proc/self/status; ulimit -a; cat /proc/self/cgroup; "
    "hostname; cut -d' ' -f5 /proc/self/mountinfo; unshare -U true 2>/dev/null && echo NESTED-USERNS; "
    "cat /proc/sys/user/max_user_namespaces"
)


def test_forked_agents_commands_are_isolated_as_a_bubblewraps(state_dir: Path) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(state_dir=state_dir)
        backend = LocalBackend(settings)
        await backend.start()
        try:
            if backend.agents.zygote is None:
                pytest.skip("the zygote needs a root broker")
            sandbox = await backend.create(SandboxSpec(default_template(settings), Resources()))
            sid = sandbox.sandbox_id

            async def sh(command: str) -> str:
                result = await backend.exec(sid, ExecRequest(shell=command, timeout_s=20))
                assert result.exit_code == 0, result.stderr
                return result.stdout

            assert backend.agents.agents[sid].proc is not None and backend.agents.zygote.proc is not None
            # the agent is busy with the first: the second runs through a bubblewrap of its own
            _, alone = await asyncio.gather(sh("sleep 1"), sh(PROBE))
            via_agent = await sh(PROBE)
            assert via_agent == alone
            assert "CapEff:\t0000000000000000" in via_agent and "CapBnd:\t0000000000000000" in via_agent
            assert "NoNewPrivs:\t1" in via_agent and "Uid:\t1000\t1000\t1000\t1000" in via_agent
            assert "NESTED-USERNS" not in via_agent
            # every namespace of the agent's command is that of the sandbox's pid 1 (bubblewrap's stub)
            same = '[ "$(readlink /proc/self/ns/$n)" = "$(readlink /proc/1/ns/$n)" ] || echo $n'
            assert await sh(f"for n in {NAMESPACES}; do {same}; done") == ""
            for name in NAMESPACES.split():  # and none is the host's
                host = os.readlink(f"/proc/self/ns/{name}")
                assert (await sh(f"readlink /proc/self/ns/{name}")).strip() != host
            assert (await sh("echo $PPID")).strip() not in ("0", "1")  # the agent, not the stub
            assert (await asyncio.gather(sh("sleep 1"), sh("echo $PPID")))[1] == "1\n"  # bubblewrap's init

            # a zygote that died is started again at the next sandbox's agent
            zygote = backend.agents.zygote.proc
            zygote.kill()
            await zygote.wait()
            again = (await backend.create(SandboxSpec(default_template(settings), Resources()))).sandbox_id
            assert again in backend.agents.agents and backend.agents.zygote.proc is not zygote
            assert (await backend.exec(again, ExecRequest(shell="echo $PPID", timeout_s=20))).stdout != "1\n"
        finally:
            await backend.close()
        assert backend.agents.zygote is None or backend.agents.zygote.proc is None

    asyncio.run(scenario())

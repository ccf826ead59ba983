"""The resident exec agent of local sandboxes (backends/exec_agent.py): commands run through one
long-lived process per sandbox, yet each keeps the semantics of a bubblewrap of its own: its leftovers
die with it, it cannot reach the agent's pipes, killing the agent only ends the command, and a second,
concurrent command runs beside it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.protocol.sandboxes import ExecRequest, Resources
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = needs_bwrap


def test_commands_share_one_agent_and_keep_their_own_semantics(state_dir: Path) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(state_dir=state_dir)
        backend = LocalBackend(settings)
        await backend.start()
        sandbox = await backend.create(SandboxSpec(default_template(settings), Resources()))
        sid = sandbox.sandbox_id

        async def sh(command: str, **extra: object) -> tuple[int, str, str]:
            result = await backend.exec(sid, ExecRequest(shell=command, timeout_s=20, **extra))
            return result.exit_code, result.stdout, result.stderr

        agent = (await sh("echo $PPID"))[1]
        assert agent == (await sh("echo $PPID"))[1] and agent != "1\n"  # one resident parent, not bwrap's init
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
        assert (await sh("kill -9 -1; sleep 5"))[0] == 137
        assert await sh("echo alive; exit 3", stdin="x") == (3, "alive\n", "")

        # a second command while one runs gets a bubblewrap of its own; both finish
        both = await asyncio.gather(sh("sleep 1; echo one"), sh("echo two"))
        assert [b[:2] for b in both] == [(0, "one\n"), (0, "two\n")]

        await backend.destroy(sid)
        assert sid not in backend.agents.agents
        await backend.close()

    asyncio.run(scenario())

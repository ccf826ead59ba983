"""A local sandbox's meta is read once per broker process (``local_known.py``), yet a sandbox that
is gone answers ``sandbox_died`` at its next command, whoever destroyed it: this replica, or another
replica on the same host and state directory. Real sandboxes, two backends in one process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, Resources
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = needs_bwrap

ECHO = ExecRequest(shell="echo hi", timeout_s=20)


async def _gone(backend: LocalBackend, sandbox_id: str) -> None:
    with pytest.raises(PlatformError) as died:
        await backend.exec(sandbox_id, ECHO)
    assert died.value.code == ErrorCode.SANDBOX_DIED


def test_a_sandbox_destroyed_anywhere_is_gone_here(state_dir: Path) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(state_dir=state_dir)
        here, there = LocalBackend(settings), LocalBackend(settings)  # two replicas on one host
        await here.start()
        await there.start()
        spec = SandboxSpec(default_template(settings), Resources())
        try:
            mine, other = (await here.create(spec)).sandbox_id, (await here.create(spec)).sandbox_id
            assert (await here.exec(mine, ECHO)).stdout == "hi\n" and len(here.known) == 2
            assert (await there.exec(other, ECHO)).stdout == "hi\n"  # read from disk there, then known
            await there.destroy(mine)  # the other replica tears it down
            await _gone(here, mine)
            assert len(here.known) == 1  # forgotten once found gone
            await here.destroy(other)  # this one: gone here and for the replica that knew it too
            await _gone(here, other)
            await _gone(there, other)
            await _gone(here, "loc-never")
        finally:
            await here.close()
            await there.close()

    asyncio.run(scenario())


def test_a_sandbox_destroyed_under_its_command_is_gone(state_dir: Path) -> None:
    async def scenario() -> None:
        settings = BrokerSettings(state_dir=state_dir)
        backend = LocalBackend(settings)
        await backend.start()
        try:
            sandbox_id = (await backend.create(SandboxSpec(default_template(settings), Resources()))).sandbox_id
            running = asyncio.ensure_future(backend.exec(sandbox_id, ExecRequest(shell="sleep 30", timeout_s=60)))
            await asyncio.sleep(1.0)
            await backend.destroy(sandbox_id)
            with pytest.raises(PlatformError) as died:
                await running
            assert died.value.code == ErrorCode.SANDBOX_DIED
        finally:
            await backend.close()

    asyncio.run(scenario())

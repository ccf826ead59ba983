"""The ``command`` agent with ``where: "host"`` (bring your own, trusted single-tenant setups): the
user's program, started per episode beside the task sandbox, confined (``host_agent.confined``),
pointed at the episode's gateway session.

Its environment is small on purpose (none of the worker's own settings or secrets):
``PATH``, ``HOME`` (a fresh directory), ``LANG``, ``PYTHONPATH``; the gateway
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``, ``ANTHROPIC_BASE_URL``,
``ANTHROPIC_API_KEY``, ``ANTHROPIC_MODEL``); the task (``ROLLOUT_TASK``); the sandbox
(``ROLLOUT_BROKER_URL``, ``ROLLOUT_BROKER_TOKEN``, ``ROLLOUT_LEASE_ID``, ``ROLLOUT_WORKDIR``: see
``agent_client.sandbox``; the token reaches exec and files of this one lease, nothing else);
then the spec's own ``env``. The episode ends when the program exits, a cap refuses its calls
(it sees an API error) or the wall clock runs out (it is killed with its process group); its
exit status and the tail of its output are recorded on the trajectory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import Callable

from services.protocol.agents import CommandAgent
from services.protocol.trajectory import AgentRun
from services.runtime.subprocess_pipes import close_pipes

_PASSED = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "TZ")


def command_env(spec: CommandAgent, gateway: dict[str, str], sandbox: dict[str, str], task: str) -> dict[str, str]:
    base = {k: os.environ[k] for k in _PASSED if k in os.environ}
    return {**base, **gateway, **sandbox, "ROLLOUT_TASK": task, **spec.env}


Confine = Callable[[str, list[str]], list[str]]  # (home, argv) -> the command line that runs argv


async def run_command(spec: CommandAgent, env: dict[str, str], record: AgentRun, confine: Confine,
                      uid: int | None) -> None:  # fmt: skip
    """Run the program to its end, as ``uid`` (None: this process's) with a fresh home it owns; on
    cancellation (wall clock, shutdown) kill its process group (its pid namespace dies with it)."""
    with tempfile.TemporaryDirectory(prefix="agent-") as home:
        if uid is not None:
            os.chown(home, uid, uid)
        proc = await asyncio.create_subprocess_exec(
            *confine(home, spec.argv), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env={"HOME": home, **env}, cwd=home,
            start_new_session=True,
        )  # fmt: skip
        tail = bytearray()
        try:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65_536):
                tail += chunk
                del tail[: max(0, len(tail) - spec.output_max_bytes)]
            record.exit_code = await proc.wait()
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.shield(proc.wait())
            close_pipes(proc)  # cancelled mid-read: its output is not wanted, whoever still holds the pipe
            record.last_output = tail.decode(errors="replace")

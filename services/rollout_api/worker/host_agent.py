"""``where: "host"`` agents, confined (trusted single-tenant setups only, docs/security.md).

Refused unless the operator allows it (``ROLLOUT_WORKER_ALLOW_HOST_AGENTS``) and while more than one
job exists. Where it runs, the program is started through bubblewrap: as a dedicated unprivileged uid
(``host_agent_uid``; when the worker runs as root, else the worker's own uid in a user namespace), in
its own pid, ipc and uts namespaces with a fresh ``/proc`` that shows only its own processes (no
other process's environment or command line), the host's filesystem read-only but for its own home,
no capabilities, and an environment holding only the episode's variables (``command_agent.command_env``).
It shares the host's network: it reaches the proxy and the broker on the addresses the worker uses.
"""

from __future__ import annotations

import functools
import os
import shutil

from redis.asyncio import Redis

from services.protocol import ErrorCode, InfraStage, keys
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.command_agent import Confine


async def check_host_agent(settings: WorkerSettings, redis: Redis) -> None:
    """A non-retried infra error where a host agent may not run here (the setting, the jobs, bubblewrap)."""
    if not settings.allow_host_agents:
        raise _refused("this worker runs agents inside the task sandbox only (ROLLOUT_WORKER_ALLOW_HOST_AGENTS "
                       "is off)", ErrorCode.FORBIDDEN)  # fmt: skip
    jobs = int(await redis.scard(keys.jobs_index()))
    if jobs > 1:
        raise _refused(f"host agents are for single-tenant setups and {jobs} jobs exist", ErrorCode.CONFLICT)
    if shutil.which("bwrap") is None:
        raise _refused("host agents run under bubblewrap, and this host has none (apt-get install bubblewrap)",
                       ErrorCode.BAD_REQUEST)  # fmt: skip


def _refused(why: str, code: ErrorCode) -> InfraError:
    return InfraError(InfraStage.WORKER, code, f'a command agent with where "host" is refused: {why}', retryable=False)


def agent_uid(settings: WorkerSettings) -> int | None:
    """The uid the agent runs as: the dedicated one when this worker can switch to it (root), else None
    (the worker's own uid, mapped into a user namespace)."""
    return settings.host_agent_uid if os.geteuid() == 0 else None


def confinement(settings: WorkerSettings) -> Confine:
    """How this worker confines a host agent: (home, argv) -> the command line (``confined``)."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None, "check_host_agent first"
    return functools.partial(confined, bwrap, agent_uid(settings))


def confined(bwrap: str, uid: int | None, home: str, argv: list[str]) -> list[str]:
    """``argv`` under bubblewrap: own pid/ipc/uts/user namespaces, fresh /proc, / read-only, ``home`` writable."""
    drop: list[str] = []
    if uid is not None:
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all"]  # fmt: skip
    return [
        *drop, bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--disable-userns",
        "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--bind", home, home, "--chdir", home,
        "--", *argv,
    ]  # fmt: skip

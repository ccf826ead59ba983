"""``where: "paired"``: the ``command`` agent runs in a sandbox of its own (``agent_template``, its
bundle mounted there) and drives the task sandbox with ``agent_client.sandbox.SandboxClient``.

The agent sandbox is leased per attempt beside the task's, with the same job, TTL and labels (plus
``agent_of``: the task's lease id); it sits in the worker's held leases, so the heartbeat renews both
together, a dead worker lets both expire together, and the attempt releases it before the task's.
Its forwarder relays ``/e/{session}/...`` to the proxy and ``/leases/{task lease}/...`` to the broker
(``POST /leases/{id}/gateway`` with ``task_lease``); inside, both are ``http://127.0.0.1:PORT``. The
agent holds a lease token of the task's lease only (exec and files there, revoked when it ends),
never the task's files: they are in the other sandbox.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from services.protocol.agents import CommandAgent
from services.protocol.gateway import SESSION_GRACE_S
from services.protocol.sandboxes import Lease, LeaseRequest
from services.protocol.trajectory import AgentRun
from services.rollout_api.worker.broker_client import release_quietly
from services.rollout_api.worker.sandbox_agent import run_in_sandbox
from services.runtime.auth import mint_lease_token, revoke_lease_token

if TYPE_CHECKING:
    from services.rollout_api.worker.agent import Episode
    from services.rollout_api.worker.gateway_agents import OpenSession


async def run_paired(episode: Episode, task: Lease, opened: OpenSession, agent: CommandAgent,
                     record: AgentRun) -> bool:  # fmt: skip
    """Lease the agent's sandbox, run the program there to its end, release it; whether the episode's
    wall clock ended the program."""
    deps, item = episode.deps, episode.item
    assert deps.redis is not None
    labels = {"trajectory": item.trajectory_id, "attempt": str(episode.traj.attempt), "agent_of": task.id}
    request = LeaseRequest(template=agent.agent_template or "default", ttl_s=deps.settings.lease_ttl_s, job=item.job,
                           labels=labels, wait_s=deps.settings.lease_wait_s)  # fmt: skip
    box = await deps.broker.lease(request)
    deps.leases.add(box.id)  # renewed with the task's lease, expires with it when this worker dies
    ttl, port = item.limits.wall_clock_s + SESSION_GRACE_S, deps.settings.sandbox_gateway_port
    token = await mint_lease_token(deps.redis, task.id, ttl)
    try:
        await deps.broker.bind_gateway(box.id, opened.session.session, opened.proxy_url, ttl, task_lease=task.id)
        base = f"http://127.0.0.1:{port}"
        sandbox = {"ROLLOUT_BROKER_URL": base, "ROLLOUT_BROKER_TOKEN": token, "ROLLOUT_LEASE_ID": task.id,
                   "ROLLOUT_WORKDIR": episode.workdir}  # fmt: skip
        env = {**opened.env(base), **sandbox, "ROLLOUT_TASK": item.task.prompt, **agent.env}
        return await run_in_sandbox(deps.broker, box.id, agent, env, cwd=box.workdir, gateway_port=port,
                                    timeout_s=item.limits.wall_clock_s, record=record)  # fmt: skip
    finally:
        await asyncio.shield(revoke_lease_token(deps.redis, token))
        deps.leases.discard(box.id)
        await release_quietly(deps.broker, box.id)

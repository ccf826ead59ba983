"""Agents served by the gateway (``tools``, ``command``): a session per attempt, the agent run
against it, and the trajectory's tokens taken from the session's log (never re-tokenized).

The session lives in Redis (``keys.gateway_session``) until the episode's wall clock plus a
grace; when the agent is done the worker closes it (later calls get 404) and reads the log.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

if TYPE_CHECKING:
    from services.protocol.sandboxes import Lease
    from services.rollout_api.worker.agent import Episode

from services.protocol import Cap, Trajectory, Turn, WorkItem, keys
from services.protocol.agents import CommandAgent, EnvAgent, ToolsAgent
from services.protocol.gateway import (
    SESSION_GRACE_S,
    GatewayCall,
    GatewaySession,
    decode_call,
    new_session_token,
    segments_from_calls,
    token_digest,
)
from services.protocol.trajectory import AgentRun
from services.rollout_api.worker.command_agent import command_env, run_command
from services.rollout_api.worker.env_agent import EnvRun
from services.rollout_api.worker.host_agent import agent_uid, check_host_agent, confinement
from services.rollout_api.worker.paired_agent import run_paired
from services.rollout_api.worker.sandbox_agent import run_in_sandbox
from services.rollout_api.worker.tools_agent import ToolsRun
from services.runtime.auth import mint_lease_token, revoke_lease_token


@dataclass(frozen=True, slots=True)
class OpenSession:
    session: GatewaySession
    token: str
    proxy_url: str

    @property
    def openai_base(self) -> str:
        return f"{self.proxy_url}/e/{self.session.session}/v1"

    def env(self, base: str) -> dict[str, str]:
        """The agent's OpenAI/Anthropic variables, the gateway reached at ``base``."""
        model, sid = self.session.model, self.session.session
        return {"OPENAI_BASE_URL": f"{base}/e/{sid}/v1", "OPENAI_API_KEY": self.token, "OPENAI_MODEL": model,
                "ANTHROPIC_BASE_URL": f"{base}/e/{sid}", "ANTHROPIC_API_KEY": self.token,
                "ANTHROPIC_MODEL": model}  # fmt: skip


async def open_session(redis: Redis, item: WorkItem, attempt: int, proxy_url: str, llm_timeout_s: float) -> OpenSession:
    """Write the attempt's session: its token's digest, the job, the caps and the rollout's sampling."""
    sid, token = secrets.token_hex(12), new_session_token()
    agent = item.agent
    model = agent.model if isinstance(agent, CommandAgent) else "policy"
    parser = agent.parser if isinstance(agent, ToolsAgent) else None
    limits = item.limits
    session = GatewaySession(
        session=sid, token_sha256=token_digest(token), job=item.job, trajectory_id=item.trajectory_id,
        attempt=attempt, pool=item.pool, model=model, expires_at=time.time() + limits.wall_clock_s + SESSION_GRACE_S,
        max_turns=limits.max_turns, max_tokens_per_turn=limits.max_tokens_per_turn,
        max_trajectory_tokens=limits.max_trajectory_tokens, sampling=item.sampling.model_dump(),
        tool_parser=parser, deadline_s=llm_timeout_s,
    )  # fmt: skip
    ttl = int(limits.wall_clock_s + SESSION_GRACE_S)
    await redis.set(keys.gateway_session(sid), session.model_dump_json(), ex=ttl)
    return OpenSession(session, token, proxy_url)


async def close_session(redis: Redis, sid: str) -> tuple[list[GatewayCall], dict[str, str]]:
    """End the session (later calls get 404) and read its log and state."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.gateway_session(sid))
        pipe.hset(keys.gateway_state(sid), "closed", 1)
        pipe.lrange(keys.gateway_calls(sid), 0, -1)
        pipe.hgetall(keys.gateway_state(sid))
        _, _, raw_calls, raw_state = await pipe.execute()
    state = {_text(k): _text(v) for k, v in raw_state.items()}
    return [decode_call(raw) for raw in raw_calls], state


def fill_trajectory(traj: Trajectory, calls: list[GatewayCall], run: AgentRun) -> None:
    """Token data, turns and the agent record from the session's calls."""
    segments = segments_from_calls(calls)
    if segments:
        first = segments[0]
        traj.prompt_ids, traj.response_ids = first.prompt_ids, first.response_ids
        traj.loss_mask, traj.response_logprobs = first.loss_mask, first.response_logprobs
        traj.routed_experts, traj.segments = first.routed_experts, segments[1:]
    starts = {i: len(s.prompt_ids) for s in segments for i in s.calls}
    for call in sorted(calls, key=lambda c: c.index):
        traj.turns.append(
            Turn(
                index=call.index, response_offset=len(call.prompt_ids) - starts[call.index],
                response_tokens=len(call.output_ids), prompt_tokens=len(call.prompt_ids),
                weight_version=call.weight_version, engine_id=call.engine_id, finish_reason=call.finish_reason,
                llm_s=call.llm_s,
            )
        )  # fmt: skip
        traj.timings.llm_s += call.llm_s
    run.calls = len(calls)
    run.retokenization_mismatches = sum(1 for c in calls if c.mismatch)
    traj.agent = run


def cap_of(state: dict[str, Any]) -> Cap | None:
    value = state.get("truncated")
    return Cap(value) if value else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def run_gateway_agent(episode: Episode, lease: Lease) -> Cap | None:
    """Open the attempt's session, run the agent against it, then close it and fill the trajectory
    from its log (also when the wall clock or a cancellation cut the agent short)."""
    deps, item = episode.deps, episode.item
    settings = deps.settings
    assert deps.redis is not None, "gateway agents need the worker's Redis"
    agent = item.agent
    if isinstance(agent, CommandAgent) and agent.where == "host":
        await check_host_agent(settings, deps.redis)  # before anything is opened
    opened = await open_session(deps.redis, item, episode.traj.attempt, settings.proxy_url.rstrip("/"),
                                settings.llm_timeout_s)  # fmt: skip
    record = AgentRun(kind=item.agent.kind, session=opened.session.session)
    cap: Cap | None = None
    state: dict[str, str] = {}
    try:
        cap = await _run_agent(episode, lease, opened, record)
    finally:
        calls, state = await asyncio.shield(close_session(deps.redis, opened.session.session))
        fill_trajectory(episode.traj, calls, record)
    return cap_of(state) or cap


async def _run_agent(episode: Episode, lease: Lease, opened: OpenSession, record: AgentRun) -> Cap | None:
    deps, item, agent = episode.deps, episode.item, episode.item.agent
    if isinstance(agent, ToolsAgent):
        run = ToolsRun(
            spec=agent, http=deps.proxy.session, base_url=opened.openai_base, token=opened.token,
            broker=deps.broker, lease_id=lease.id, workdir=episode.workdir, env=item.task.sandbox.env,
            command_timeout_s=item.limits.command_timeout_s,
            observation_max_bytes=item.limits.observation_max_bytes, max_turns=item.limits.max_turns,
        )  # fmt: skip
        return await run.run(item.task.prompt, record)
    if isinstance(agent, EnvAgent):
        env_run = EnvRun(spec=agent, http=deps.proxy.session, base_url=opened.openai_base, token=opened.token,
                         broker=deps.broker, lease_id=lease.id, workdir=episode.workdir,
                         max_turns=item.limits.max_turns)  # fmt: skip
        return await env_run.run(item.task.prompt, record)
    assert isinstance(agent, CommandAgent)
    if agent.where == "sandbox":
        # the broker forwards this session, and nothing else, to a loopback port inside the sandbox
        limits, port = item.limits, deps.settings.sandbox_gateway_port
        await deps.broker.bind_gateway(lease.id, opened.session.session, opened.proxy_url,
                                       limits.wall_clock_s + SESSION_GRACE_S)  # fmt: skip
        gateway = opened.env(f"http://127.0.0.1:{port}")
        env = {**gateway, "ROLLOUT_TASK": item.task.prompt, **item.task.sandbox.env, **agent.env}
        ended = await run_in_sandbox(deps.broker, lease.id, agent, env, cwd=episode.workdir, gateway_port=port,
                                     timeout_s=limits.wall_clock_s, record=record)  # fmt: skip
        return Cap.WALL_CLOCK if ended else None
    if agent.where == "paired":
        return Cap.WALL_CLOCK if await run_paired(episode, lease, opened, agent, record) else None
    await _run_on_host(episode, lease, opened, agent, record)
    return None


async def _run_on_host(episode: Episode, lease: Lease, opened: OpenSession, agent: CommandAgent,
                       record: AgentRun) -> None:  # fmt: skip
    """``where: "host"``: a child of this worker (trusted single-tenant setups only)."""
    deps, item = episode.deps, episode.item
    gateway = opened.env(opened.proxy_url)
    assert deps.redis is not None
    # the agent's own broker token: exec and files on this lease only, revoked when the agent ends
    ttl = item.limits.wall_clock_s + SESSION_GRACE_S
    broker_token = await mint_lease_token(deps.redis, lease.id, ttl)
    sandbox = {"ROLLOUT_BROKER_URL": deps.broker.url, "ROLLOUT_BROKER_TOKEN": broker_token,
               "ROLLOUT_LEASE_ID": lease.id, "ROLLOUT_WORKDIR": episode.workdir}  # fmt: skip
    try:
        await run_command(agent, command_env(agent, gateway, sandbox, item.task.prompt), record,
                          confinement(deps.settings), agent_uid(deps.settings))  # fmt: skip
    finally:
        await asyncio.shield(revoke_lease_token(deps.redis, broker_token))

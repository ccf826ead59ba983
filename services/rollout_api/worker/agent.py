"""One attempt of one episode: lease a sandbox, run the bash agent turn by turn with the token
sequence held here (token in, token out), score it, release the sandbox.

Raises :class:`InfraError` when the platform fails the attempt and ``CancelledError`` when it is
stopped; returns the trajectory (completed or truncated) otherwise.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from services.protocol import (
    Cap,
    ErrorCode,
    InfraStage,
    Message,
    RewardDetails,
    Status,
    Trajectory,
    Turn,
    WorkItem,
)
from services.protocol.agents import BashAgent
from services.protocol.sandboxes import ExecRequest, ExecResult, Lease, LeaseRequest, Resources, SandboxSetup
from services.rollout_api.publishing import trajectory_shell
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker import grading
from services.rollout_api.worker.broker_client import BrokerClient, release_quietly
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.conversation import (
    format_error,
    observation,
    parse_action,
    submitted_by_output,
    system_message,
    task_message,
)
from services.rollout_api.worker.gateway_agents import run_gateway_agent
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.outages import Outages
from services.rollout_api.worker.proxy_client import ContextExceeded, Generation, ProxyClient, sampling_params
from services.rollout_api.worker.restore import Snapshot, snapshot
from services.rollout_api.worker.reward import score
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.tokens import TokenBuffer


@dataclass
class AgentDeps:
    """What every episode of a worker shares."""

    proxy: ProxyClient
    broker: BrokerClient
    tokenizer: ChatTokenizer
    settings: WorkerSettings
    worker_id: str
    metrics: WorkerMetrics
    leases: set[str] = field(default_factory=set)  # held now; renewed by the worker's heartbeat
    pool_tokenizers: dict[str, ChatTokenizer] = field(default_factory=dict)  # a pool's served model's
    redis: Redis | None = None  # gateway sessions of tools/command agents
    outages: Outages | None = None  # the breakers of the proxy and the broker

    def tokenizer_for(self, pool: str) -> ChatTokenizer:
        return self.pool_tokenizers.get(pool, self.tokenizer)


class Episode:
    def __init__(self, deps: AgentDeps, item: WorkItem, attempt: int) -> None:
        self.deps = deps
        self.item = item
        self.limits = item.limits
        self.traj = trajectory_shell(item, attempt, Status.COMPLETED, worker=deps.worker_id)
        self.tokens = TokenBuffer()
        self.sampling = sampling_params(item.sampling)  # once per episode, not per turn
        self.messages: list[dict[str, str]] = []
        self.workdir = item.task.sandbox.workdir or "/workspace"  # the lease's, once leased
        self.saved: Snapshot = {}  # the reward's files as they were before the agent ran
        self.base = ""  # grade_in "fresh": the commit the agent started from

    async def run(self) -> Trajectory:
        traj = self.traj
        traj.timings.queued_s = max(0.0, traj.started_at - self.item.enqueued_at)
        lease = await self._lease()
        spec, env = self.item.task.reward, self.item.task.sandbox.env
        try:
            cap = await self._run_capped(lease)
            traj.status = Status.TRUNCATED if cap else Status.COMPLETED
            traj.truncation = cap
            started = time.monotonic()
            if spec.grade_in == "fresh":  # the agent's change, then its sandbox goes (and all it left running)
                change = await grading.take_change(self.deps.broker, lease.id, self.base, self.workdir, env, spec)
            else:
                traj.reward, traj.reward_details = await score(
                    self.deps.broker, lease.id, spec, cwd=self.workdir, env=env, saved=self.saved
                )
                traj.timings.reward_s = time.monotonic() - started
        finally:
            self.deps.leases.discard(lease.id)
            await release_quietly(self.deps.broker, lease.id)
        if spec.grade_in == "fresh":  # the change taken, the agent's sandbox released, the grading sandbox
            traj.reward, traj.reward_details = await self._grade_fresh(change)
            traj.timings.reward_s = time.monotonic() - started
        return self._finish()

    async def _grade_fresh(self, change: grading.Change | RewardDetails) -> tuple[float, RewardDetails]:
        """The reward in a new sandbox with only the agent's (filtered) change applied (``grading``)."""
        if isinstance(change, RewardDetails):
            self.deps.metrics.fresh_grades.labels("not_taken").inc()
            return 0.0, change
        self.deps.metrics.grade_dropped_paths.inc(len(change.dropped))
        spec, env = self.item.task.reward, self.item.task.sandbox.env
        started = time.monotonic()
        lease = await self.deps.broker.lease(self._lease_request(grading="1"))
        self.deps.leases.add(lease.id)
        try:
            failed = await grading.apply_change(self.deps.broker, lease.id, change, self.workdir, env, spec.timeout_s)
            self.traj.timings.grade_s = time.monotonic() - started
            self.deps.metrics.fresh_grades.labels("not_applied" if failed else "applied").inc()
            reward, details = (0.0, failed) if failed else await score(self.deps.broker, lease.id, spec,
                                                                      cwd=self.workdir, env=env)  # fmt: skip
        finally:
            self.deps.leases.discard(lease.id)
            await release_quietly(self.deps.broker, lease.id)
        details.dropped = change.dropped
        return reward, details

    def _lease_request(self, **labels: str) -> LeaseRequest:
        spec = self.item.task.sandbox
        return LeaseRequest(
            template=spec.template,
            resources=Resources(cpus=spec.cpus, memory_mb=spec.memory_mb, disk_mb=spec.disk_mb),
            ttl_s=self.deps.settings.lease_ttl_s,
            job=self.item.job,
            labels={"trajectory": self.item.trajectory_id, "attempt": str(self.traj.attempt), **labels},
            network=spec.network,
            isolation=spec.isolation,
            wait_s=self.deps.settings.lease_wait_s,
            setup=self._setup_request(),
        )

    async def _lease(self) -> Lease:
        spec = self.item.task.sandbox
        started = time.monotonic()
        lease = await self.deps.broker.lease(self._lease_request())
        self.deps.leases.add(lease.id)
        self.workdir = spec.workdir or lease.workdir
        self.traj.timings.sandbox_start_s = time.monotonic() - started
        return lease

    async def _run_capped(self, lease: Lease) -> Cap | None:
        """Setup and the agent loop under the episode's wall clock."""
        try:
            async with asyncio.timeout(self.limits.wall_clock_s):
                await self._setup(lease)
                return await self._agent_loop(lease)
        except TimeoutError:
            return Cap.WALL_CLOCK

    async def _agent_loop(self, lease: Lease) -> Cap | None:
        agent = self.item.agent
        if isinstance(agent, BashAgent):
            return await self._loop(lease, agent)
        return await run_gateway_agent(self, lease)

    def _setup_request(self) -> SandboxSetup | None:
        """The task's files and setup commands, run by the broker: once per group (the rollout's
        samples share one run where the backend can fork sandboxes), else once per lease."""
        spec = self.item.task.sandbox
        if not (spec.files or spec.setup):
            return None
        return SandboxSetup(key=self.item.group_id, files=spec.files, commands=spec.setup, env=spec.env,
                            cwd=spec.workdir, timeout_s=self.limits.command_timeout_s)  # fmt: skip

    async def _setup(self, lease: Lease) -> None:
        """The broker ran the task's files and setup commands with the lease (``_setup_request``);
        keep the reward's files as they are now."""
        started = time.monotonic()
        reward, env = self.item.task.reward, self.item.task.sandbox.env
        if reward.grade_in == "fresh":  # nothing to restore: the grading sandbox is new
            self.base = await grading.base_commit(self.deps.broker, lease.id, self.workdir, env)
        else:
            self.saved = await snapshot(self.deps.broker, lease.id, reward.restore, self.workdir)
        self.traj.timings.setup_s = lease.setup_s + time.monotonic() - started
        self.traj.timings.setup_shared = lease.setup_shared

    async def _loop(self, lease: Lease, agent: BashAgent) -> Cap | None:
        tok = self.deps.tokenizer_for(self.item.pool)
        self.messages = [
            {"role": "system", "content": system_message(agent)},
            {"role": "user", "content": task_message(self.item.task.prompt, agent)},
        ]
        max_turns = min(self.limits.max_turns, agent.step_limit or self.limits.max_turns)
        self.tokens.set_prompt(tok.prompt_ids(self.messages))
        pending: list[int] = []  # the last observation's tokens, sent with the next call
        for index in range(max_turns):
            budget = self.limits.max_trajectory_tokens - self.tokens.total - len(pending)
            if budget <= 0:
                return Cap.TRAJECTORY_TOKENS
            self.tokens.add_observation(pending)
            max_new = min(self.limits.max_tokens_per_turn, budget)
            try:
                generation, turn = await self._generate(index, max_new)
            except ContextExceeded:
                return Cap.CONTEXT_LENGTH
            if generation.finish_reason == "length":
                return self._length_cap(len(generation.output_ids), max_new)
            if generation.finish_reason == "abort":
                raise InfraError(InfraStage.LLM, ErrorCode.ENGINE_ERROR, "the engine aborted the generation")
            reply = tok.decode(generation.output_ids)
            self.messages.append({"role": "assistant", "content": reply})
            action = parse_action(reply, agent)
            if action.submits:
                return None
            if action.command is None:
                content = format_error(action, agent)
            else:
                result = await self._execute(lease, action.command, turn)
                if result is None:
                    return Cap.COMMAND_TIMEOUT
                if submitted_by_output(result, agent):
                    return None
                content = observation(result, self.limits.observation_max_bytes, agent)
            message = {"role": "user", "content": content}
            self.messages.append(message)
            ended = bool(generation.output_ids) and generation.output_ids[-1] == tok.eos_id
            pending = tok.message_ids(message, reply_ended_with_eos=ended)
            turn.observation_tokens = len(pending)
        return Cap.TURNS

    def _length_cap(self, generated: int, max_new: int) -> Cap:
        """Which cap cut a reply that ended by length: fewer tokens than asked means the proxy's
        context guard clamped it to the room left in the engine's context."""
        if generated < max_new:
            return Cap.CONTEXT_LENGTH
        return Cap.TURN_TOKENS if max_new == self.limits.max_tokens_per_turn else Cap.TRAJECTORY_TOKENS

    async def _generate(self, index: int, max_new: int) -> tuple[Generation, Turn]:
        started = time.monotonic()
        generation = await self.deps.proxy.generate(
            self.tokens.context_json(), self.sampling, max_new,
            pool=self.item.pool, session_id=self.traj.attempt_key, job=self.item.job,
        )  # fmt: skip
        llm_s = time.monotonic() - started
        self.deps.metrics.llm_calls.inc()
        turn = Turn(
            index=index,
            response_offset=len(self.tokens.response_ids),
            response_tokens=len(generation.output_ids),
            prompt_tokens=self.tokens.total,
            cached_tokens=generation.cached_tokens,
            weight_version=generation.weight_version,
            engine_id=generation.engine_id,
            finish_reason=generation.finish_reason,
            llm_s=llm_s,
        )
        self.tokens.add_generated(generation.output_ids, generation.logprobs)
        self.traj.turns.append(turn)
        self.traj.timings.llm_s += llm_s
        return generation, turn

    async def _execute(self, lease: Lease, command: str, turn: Turn) -> ExecResult | None:
        """Run the agent's command; its result, or None when it hit the command timeout."""
        spec = self.item.task.sandbox
        request = ExecRequest(
            shell=command, timeout_s=self.limits.command_timeout_s, env=spec.env, cwd=self.workdir,
            max_output_bytes=max(4 * self.limits.observation_max_bytes, 65_536),
        )  # fmt: skip
        started = time.monotonic()
        result = await self.deps.broker.exec(lease.id, request)
        turn.exec_s = time.monotonic() - started
        turn.exit_code = result.exit_code
        self.traj.timings.exec_s += turn.exec_s
        return None if result.timed_out else result

    def _finish(self) -> Trajectory:
        traj = self.traj
        if isinstance(self.item.agent, BashAgent):  # gateway agents' tokens come from their session log
            traj.prompt_ids, traj.response_ids, traj.loss_mask, traj.response_logprobs = self.tokens.arrays()
        traj.finished_at = time.time()
        traj.timings.total_s = traj.finished_at - traj.started_at
        if self.deps.settings.keep_messages:
            traj.messages = [Message(role=m["role"], content=m["content"]) for m in self.messages]
        return traj

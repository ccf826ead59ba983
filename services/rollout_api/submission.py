"""Turning a ``RolloutRequest`` into work items and admitting them atomically."""

from __future__ import annotations

import secrets
import time
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from services.protocol import ErrorCode, PlatformError, RolloutRequest, WorkItem, keys
from services.protocol.agents import CommandAgent
from services.protocol.api import RolloutAccepted
from services.rollout_api.context import ApiContext
from services.rollout_api.records import JobRecord, int_field
from services.rollout_api.redis_scripts import Admitted
from services.runtime.http_errors import validation_error

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> PlatformError:
    return PlatformError(ErrorCode.PAYLOAD_TOO_LARGE, f"request body over {limit} bytes")


def parse(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def new_rollout_id(job: str) -> str:
    """``<job>.<random hex>``: the job is recoverable from the id (``job_of``)."""
    return f"{job}.{secrets.token_hex(8)}"


def job_of(rollout_id: str) -> str:
    job, sep, _ = rollout_id.rpartition(".")
    if not sep or not job:
        raise PlatformError(ErrorCode.NOT_FOUND, f"no rollout {rollout_id!r}")
    return job


def check_unique_tasks(request: RolloutRequest) -> None:
    seen: set[str] = set()
    for index, task in enumerate(request.tasks):
        if task.id in seen:
            raise PlatformError(ErrorCode.VALIDATION_ERROR, f"duplicate task id {task.id!r}", field=f"tasks.{index}.id")
        seen.add(task.id)


async def check_templates(ctx: ApiContext, request: RolloutRequest) -> None:
    known = await ctx.templates.names(ctx.http)
    if known is None:
        return
    for index, task in enumerate(request.tasks):
        if task.sandbox.template not in known:
            raise PlatformError(
                ErrorCode.UNKNOWN_TEMPLATE,
                f"the broker has no template {task.sandbox.template!r}",
                field=f"tasks.{index}.sandbox.template",
            )
    named = [("agent", request.agent), *((f"tasks.{i}.agent", t.agent) for i, t in enumerate(request.tasks))]
    for field, agent in named:  # a paired agent's own sandbox
        if isinstance(agent, CommandAgent) and agent.agent_template and agent.agent_template not in known:
            raise PlatformError(ErrorCode.UNKNOWN_TEMPLATE, f"the broker has no template {agent.agent_template!r}",
                                field=f"{field}.agent_template")  # fmt: skip


async def check_agents(ctx: ApiContext, request: RolloutRequest) -> None:
    """``command`` agents on the worker's host only where the operator allows them, and only while
    one job exists (docs/security.md): 403 ``forbidden`` where the setting is off, 409 ``conflict``
    where several jobs exist (field ``agent.where`` or ``tasks.N.agent.where`` either way)."""
    named = [("agent", request.agent), *((f"tasks.{i}.agent", t.agent) for i, t in enumerate(request.tasks))]
    host = [field for field, agent in named if isinstance(agent, CommandAgent) and agent.where == "host"]
    if not host:
        return
    if not ctx.settings.allow_host_agents:
        raise PlatformError(
            ErrorCode.FORBIDDEN,
            'command agents run inside the task sandbox here: where "host" is off (an operator setting, '
            "ROLLOUT_API_ALLOW_HOST_AGENTS, for trusted single-tenant setups)",
            field=f"{host[0]}.where",
        )
    jobs = int(await ctx.redis.scard(keys.jobs_index()))
    if jobs > 1:
        raise PlatformError(
            ErrorCode.CONFLICT,
            f'where "host" runs agents beside the platform, for single-tenant setups: {jobs} jobs exist here '
            '(use where "sandbox" or "paired")',
            field=f"{host[0]}.where",
        )


def work_items(request: RolloutRequest, rollout_id: str, pool: str, now: float) -> list[tuple[str, bytes]]:
    items = []
    for index, task in enumerate(request.tasks):
        for sample in range(request.group_size):
            item = WorkItem(
                job=request.job,
                rollout_id=rollout_id,
                trajectory_id=WorkItem.make_trajectory_id(rollout_id, task.id, sample),
                task=task,
                group_id=WorkItem.make_group_id(rollout_id, task.id),
                sample_index=sample,
                group_size=request.group_size,
                max_attempts=request.max_attempts,
                limits=request.limits,
                sampling=request.sampling_for(sample, index),
                pool=pool,
                priority=request.priority,
                enqueued_at=now,
                agent=task.agent or request.agent,
                mode=request.mode,
            )
            items.append((item.trajectory_id, item.encode()))
    return items


async def admit(ctx: ApiContext, request: RolloutRequest, job: JobRecord) -> RolloutAccepted:
    check_unique_tasks(request)
    await check_agents(ctx, request)
    await check_templates(ctx, request)
    now = time.time()
    rollout_id = new_rollout_id(request.job)
    items = work_items(request, rollout_id, job.pool, now)
    record = {
        "job": request.job,
        "total": str(len(items)),
        "tasks": str(len(request.tasks)),
        "group_size": str(request.group_size),
        "idempotency_key": request.idempotency_key or "",
        "mode": request.mode,
    }
    if (options := request.eval_options) is not None:
        record["eval"] = options.model_dump_json()
    tasks_key = keys.rollout_tasks(request.job, rollout_id)
    stored: dict[Any, Any] = {task.id: task.model_dump_json() for task in request.tasks}
    await ctx.redis.hset(tasks_key, mapping=stored)  # before the items that name them
    admitted: Admitted | None = None
    try:
        admitted = await ctx.scripts.admit(
            request.job, rollout_id, request.idempotency_key, record, items,
            now=now, idempotency_ttl_s=ctx.settings.idempotency_ttl_s,
        )  # fmt: skip
    finally:
        if admitted is None or admitted.outcome != 1:  # refused, a duplicate, or failed
            await ctx.redis.delete(tasks_key)
    return await _answer(ctx, request, job, admitted, len(items))


async def _answer(
    ctx: ApiContext, request: RolloutRequest, job: JobRecord, admitted: Admitted, n_items: int
) -> RolloutAccepted:
    if admitted.outcome == -1:
        ctx.metrics.rejected.labels(ErrorCode.QUOTA_EXCEEDED.value).inc()
        raise PlatformError(
            ErrorCode.QUOTA_EXCEEDED,
            f"job {job.job!r} has {admitted.value} items queued; {n_items} more would pass max_queued "
            f"{job.quotas.max_queued}",
            retry_after_s=5.0,
        )
    if admitted.outcome == 0:
        raw: Any = await ctx.redis.hmget(keys.rollout_record(job.job, admitted.value), ["total", "tasks"])
        values = {"total": (raw[0] or b"0").decode(), "tasks": (raw[1] or b"0").decode()}
        return RolloutAccepted(
            rollout_id=admitted.value, job=job.job, tasks=int_field(values, "tasks"),
            trajectories=int_field(values, "total"), duplicate=True,
        )  # fmt: skip
    ctx.metrics.items_queued.labels(job.job).inc(n_items)
    return RolloutAccepted(rollout_id=admitted.value, job=job.job, tasks=len(request.tasks), trajectories=n_items)

"""``POST /jobs`` (admin) and ``GET /jobs/{job}``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.api import JobCreate, JobCreated, JobStatus
from services.protocol.keys import WORKERS_GROUP
from services.rollout_api.auth import hash_token, new_token
from services.rollout_api.context import AuthCaller, Ctx
from services.rollout_api.records import JobRecord, read_job
from services.rollout_api.stats import job_status
from services.runtime.groups import ensure_group_async

router = APIRouter()


@router.post("/jobs", status_code=201)
async def create_job(body: JobCreate, ctx: Ctx, caller: AuthCaller) -> JobCreated:
    caller.require_admin()
    record = JobRecord.of(body)
    token = new_token()
    token_hash = hash_token(token)
    created: Any = await ctx.redis.hsetnx(keys.job_record(body.job), "job", body.job)
    if not created:
        raise PlatformError(ErrorCode.CONFLICT, f"job {body.job!r} exists", field="job")
    # three hash tags (the job's, the job index, the token index): no transaction spans them in a Redis
    # Cluster, so the writes go in order and the token, which makes the job reachable, goes last. A
    # crash before it leaves what the HSETNX above already could: a job name taken, no token handed out.
    mapping: dict[Any, Any] = record.to_hash(token_hash, time.time())
    await ctx.redis.hset(keys.job_record(body.job), mapping=mapping)
    await ctx.redis.sadd(keys.jobs_index(), body.job)
    await ctx.redis.hset(keys.job_tokens(), token_hash, body.job)
    await ensure_group_async(ctx.redis, keys.work_stream(body.job), WORKERS_GROUP)
    return JobCreated(job=body.job, token=token)


async def job_or_404(ctx: Ctx, job: str) -> JobRecord:
    record = await read_job(ctx.redis, job)
    if record is None:
        raise PlatformError(ErrorCode.UNKNOWN_JOB, f"no job {job!r}", field="job")
    return record


@router.get("/jobs/{job}")
async def get_job(job: str, ctx: Ctx, caller: AuthCaller) -> JobStatus:
    caller.require_job(job)
    return await job_status(ctx.redis, await job_or_404(ctx, job))

"""``GET /jobs/{job}/trajectories``: the job's trajectory stream as Server-Sent Events.

Each event's ``id`` is the stream entry id and ``data`` the trajectory as JSON; a client that
reconnects with ``Last-Event-ID`` (or ``?after=``) continues after that entry; ``?mode=eval`` reads
the job's evaluation stream. The stream is read with XREAD (no consumer group): SSE readers never
take trajectories away from a trainer's group. A job that stops existing while it is followed (the
store lost its state) ends the stream with one ``event: error`` whose data is the error body
(``unknown_job``), instead of keep-alives forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.protocol import ErrorCode, PlatformError, from_stream_fields, keys, trajectory_to_json
from services.protocol.errors import ErrorBody
from services.rollout_api.context import AuthCaller, Ctx
from services.rollout_api.jobs import job_or_404
from services.rollout_api.metrics import ApiMetrics
from services.runtime.outages import Outage

log = logging.getLogger(__name__)
router = APIRouter()
MAX_ID_PART = 2**64 - 1  # each half of a stream entry id is an unsigned 64-bit integer


def is_entry_id(text: str) -> bool:
    """``ms-seq`` or ``ms``, each part ASCII digits and at most 2**64-1: what XREAD accepts."""
    ms, sep, seq = text.partition("-")
    parts = (ms, seq) if sep else (ms,)
    return all(p.isascii() and p.isdigit() and len(p) <= 20 and int(p) <= MAX_ID_PART for p in parts)


def _start_id(last_event_id: str | None, after: str | None) -> str:
    """Where the stream starts: the header wins over ``?after=``; an empty one counts as unset. A
    malformed id is the caller's 400 naming where it came from, not a stream that closes at once."""
    for value, field in ((last_event_id, "Last-Event-ID"), (after, "after")):
        if not value:
            continue
        if value == "$" or is_entry_id(value):
            return value
        raise PlatformError(
            ErrorCode.BAD_REQUEST, f"{field} {value[:64]!r} is no stream entry id (ms-seq, each 0..2**64-1)",
            field=field,
        )  # fmt: skip
    return "0-0"


async def events(
    redis: Redis, metrics: ApiMetrics, job: str, start: str, limit: int | None, block_ms: int, mode: str = "train"
) -> AsyncIterator[bytes]:
    stream = keys.rollout_stream(job, mode)
    last, sent = start, 0
    outage = Outage(f"Redis (SSE of job {job})", log)
    yield b"retry: 1000\n\n"
    while limit is None or sent < limit:
        count = 100 if limit is None else min(100, limit - sent)
        try:
            reply: Any = await redis.xread({stream: last}, count=count, block=block_ms)
            outage.ok()
        except (RedisConnectionError, RedisTimeoutError) as exc:  # Redis is away: keep the stream, try again
            outage.failed(exc)
            metrics.sse_redis_errors.inc()
            yield b": redis unavailable, retrying\n\n"
            await asyncio.sleep(min(1.0, block_ms / 1000))
            continue
        if not reply:
            if not await _job_exists(redis, job):
                yield _gone(job)
                return
            yield b": keep-alive\n\n"
            continue
        for entry_id, fields in reply[0][1]:
            last = entry_id.decode()
            data = trajectory_to_json(from_stream_fields(fields))
            yield b"id: " + entry_id + b"\nevent: trajectory\ndata: " + data + b"\n\n"
            sent += 1
            metrics.sse_events.labels(job).inc()


async def _job_exists(redis: Redis, job: str) -> bool:
    try:
        return bool(await redis.exists(keys.job_record(job)))
    except (RedisConnectionError, RedisTimeoutError):
        return True  # Redis is away: the next read says so


def _gone(job: str) -> bytes:
    log.warning("job %s no longer exists: its trajectory stream is closed with an error", job)
    message = f"job {job!r} no longer exists (the store lost its state, or the job was removed)"
    body = ErrorBody.of(ErrorCode.UNKNOWN_JOB, message, field="job")
    return b"event: error\ndata: " + body.model_dump_json().encode() + b"\n\n"


@router.get("/jobs/{job}/trajectories")
async def stream_trajectories(
    job: str,
    ctx: Ctx,
    caller: AuthCaller,
    last_event_id: str | None = Header(None),
    after: str | None = Query(None, description="entry id to continue after (same as Last-Event-ID)"),
    limit: int | None = Query(None, ge=1, description="close the stream after this many events"),
    mode: Literal["train", "eval"] = Query("train", description="eval: the job's evaluation trajectories"),
) -> StreamingResponse:
    caller.require_job(job)
    await job_or_404(ctx, job)
    start = _start_id(last_event_id, after)
    body = events(ctx.streams, ctx.metrics, job, start, limit, ctx.settings.sse_block_ms, mode)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)

"""The dashboard's figures: per job (the API's own ``JobStatus`` plus weight versions and the
trainer's staleness), per engine and pool (the proxy), per sandbox pool (the broker)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.protocol import keys
from services.protocol.dashboard import JobView, Overview
from services.rollout_api.auth import Caller
from services.rollout_api.dashboard.sources import FleetSources, ProxyFacts
from services.rollout_api.dashboard.summaries import entries_before, staleness, summary, weight_version_counts
from services.rollout_api.records import JobRecord, read_job, read_jobs
from services.rollout_api.stats import job_status

RECENT = 50  # latest trajectories whose weight versions are counted; consumed ones sampled for staleness


async def _trainer_group(redis: Redis, job: str) -> tuple[str | None, int | None]:
    """(last-delivered entry id, lag) of the job's trainer group, or (None, None) without one."""
    try:
        groups: Any = await redis.xinfo_groups(keys.trajectory_stream(job))
    except ResponseError:  # no stream yet
        return None, None
    for group in groups:
        name = group.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == keys.TRAINERS_GROUP:
            last = group.get("last-delivered-id")
            lag = group.get("lag")
            return (last.decode() if isinstance(last, bytes) else last), (int(lag) if lag is not None else None)
    return None, None


async def _latest(redis: Redis, job: str, upto: str | None) -> list[Any]:
    before = None if upto is None else _next_id(upto)
    return [summary(fields) async for _, fields in entries_before(redis, job, before, RECENT)]


def _next_id(entry_id: str) -> str:
    """The smallest id after ``entry_id`` (``entries_before`` excludes its bound)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


async def job_view(redis: Redis, record: JobRecord, pool_version: str | None) -> JobView:
    status = await job_status(redis, record)
    delivered, lag = await _trainer_group(redis, record.job)
    recent = await _latest(redis, record.job, None)
    consumed = await _latest(redis, record.job, delivered) if delivered and delivered != "0-0" else []
    return JobView(
        status=status,
        weight_versions=weight_version_counts(recent),
        staleness=staleness(pool_version, consumed) if delivered else None,
        trainer_lag=lag,
    )


async def visible_jobs(redis: Redis, caller: Caller) -> list[JobRecord]:
    if caller.admin:
        return await read_jobs(redis)
    record = await read_job(redis, caller.job or "")
    return [record] if record else []


async def overview(redis: Redis, sources: FleetSources, caller: Caller) -> Overview:
    (proxy, proxy_error), (broker, broker_error) = await asyncio.gather(sources.proxy.get(), sources.broker.get())
    versions = {p.name: p.version for p in proxy.pools} if isinstance(proxy, ProxyFacts) else {}
    records = await visible_jobs(redis, caller)
    jobs = await asyncio.gather(*(job_view(redis, r, versions.get(r.pool)) for r in records))
    problems = [f"{name}: {error}" for name, error in (("proxy", proxy_error), ("broker", broker_error)) if error]
    return Overview(
        generated_at=time.time(), admin=caller.admin, jobs=list(jobs),
        pools=proxy.pools if proxy else [], engines=proxy.engines if proxy else [], broker=broker, problems=problems,
    )  # fmt: skip

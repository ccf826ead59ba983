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


class JobViews:
    """Job views reused for ``ttl_s`` per replica: N open pages cost what one costs."""

    def __init__(self, redis: Redis, ttl_s: float) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.seen: dict[tuple[str, str | None], tuple[float, JobView]] = {}

    async def get(self, record: JobRecord, pool_version: str | None) -> JobView:
        key, now = (record.job, pool_version), time.monotonic()
        hit = self.seen.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        view = await job_view(self.redis, record, pool_version)
        if len(self.seen) > 10_000:  # jobs come and go: forget what has not been asked for lately
            self.seen = {k: v for k, v in self.seen.items() if now - v[0] < self.ttl_s}
        self.seen[key] = (now, view)
        return view


async def visible_jobs(redis: Redis, caller: Caller) -> list[JobRecord]:
    if caller.admin:
        return await read_jobs(redis)
    record = await read_job(redis, caller.job or "")
    return [record] if record else []


async def overview(redis: Redis, sources: FleetSources, views: JobViews, caller: Caller) -> Overview:
    (proxy, proxy_error), (broker, broker_error) = await asyncio.gather(sources.proxy.get(), sources.broker.get())
    versions = {p.name: p.version for p in proxy.pools} if isinstance(proxy, ProxyFacts) else {}
    records = await visible_jobs(redis, caller)
    jobs = await asyncio.gather(*(views.get(r, versions.get(r.pool)) for r in records))
    problems = [f"{name}: {error}" for name, error in (("proxy", proxy_error), ("broker", broker_error)) if error]
    return Overview(
        generated_at=time.time(), admin=caller.admin, jobs=list(jobs),
        pools=proxy.pools if proxy else [], engines=proxy.engines if proxy else [], broker=broker, problems=problems,
    )  # fmt: skip

"""The last hour of figures: one API replica at a time samples every job and the fleet into Redis.

Every ``dashboard_sample_s`` each replica tries ``SET lock NX PX``; the one that gets it appends a
:class:`JobSample` per job and one :class:`FleetSample` (lists, newest first, trimmed to
``dashboard_history_s``). So the history exists whether or not anyone has the page open, costs a
few Redis calls per job per interval fleet-wide, and survives API restarts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.protocol import keys
from services.protocol.dashboard import BrokerView, FleetSample, History, JobSample
from services.rollout_api.dashboard.sources import FleetSources
from services.rollout_api.records import read_jobs
from services.rollout_api.stats import job_status

log = logging.getLogger(__name__)


class Sampler:
    def __init__(self, redis: Redis, sources: FleetSources, every_s: float, keep_s: float) -> None:
        self.redis = redis
        self.sources = sources
        self.every_s = every_s
        self.length = max(1, int(keep_s / every_s))

    async def run(self) -> None:
        while True:
            try:
                await self.sample_once()
            except (RedisError, OSError):
                log.warning("dashboard sampling failed; retrying in %.0f s", self.every_s, exc_info=True)
            await asyncio.sleep(self.every_s)

    async def sample_once(self) -> bool:
        """Take one round of samples unless another replica did within the interval."""
        lease_ms = max(1, int(self.every_s * 900))
        if not await self.redis.set(keys.dashboard_sample_lock(), b"1", nx=True, px=lease_ms):
            return False
        now = time.time()
        pushes: list[tuple[str, BaseModel]] = []
        for record in await read_jobs(self.redis):
            status = await job_status(self.redis, record)
            sample = JobSample(
                t=now, queue_depth=status.queue_depth, in_flight=status.in_flight, finished=status.finished,
                infra_errors=status.by_status.get("infra_error", 0), episode_p50_s=status.tail.episode_p50_s,
                episode_p99_s=status.tail.episode_p99_s,
            )  # fmt: skip
            pushes.append((keys.dashboard_job_samples(record.job), sample))
        pushes.append((keys.dashboard_fleet_samples(), await self._fleet_sample(now)))
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, model in pushes:
                pipe.lpush(key, model.model_dump_json())
                pipe.ltrim(key, 0, self.length - 1)
            await pipe.execute()
        return True

    async def _fleet_sample(self, now: float) -> FleetSample:
        proxy, _ = await self.sources.proxy.get()
        broker, _ = await self.sources.broker.get()
        engines = {e.engine_id: e.in_flight for e in proxy.engines} if proxy else {}
        broker = broker or BrokerView()
        return FleetSample(
            t=now, engines_in_flight=engines, sandboxes_ready=sum(p.ready for p in broker.pools),
            leases=broker.leases, admission_waiting=broker.admission_waiting,
        )  # fmt: skip


async def read_history(redis: Redis, job: str | None) -> History:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.lrange(keys.dashboard_job_samples(job), 0, -1) if job else pipe.echo(b"")
        pipe.lrange(keys.dashboard_fleet_samples(), 0, -1)
        job_raw, fleet_raw = await pipe.execute()
    job_rows: Any = job_raw if job else []
    return History(
        job=[JobSample.model_validate_json(r) for r in reversed(job_rows)],
        fleet=[FleetSample.model_validate_json(r) for r in reversed(fleet_raw)],
    )

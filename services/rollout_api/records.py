"""Job records in Redis (``keys.job_record``), read by the API and the workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from services.protocol import keys
from services.protocol.api import JobCreate, JobQuotas


@dataclass(frozen=True, slots=True)
class JobRecord:
    job: str
    pool: str
    weight: float
    quotas: JobQuotas

    def to_hash(self, token_hash: str, created_at: float) -> dict[str, str]:
        return {
            "job": self.job,
            "pool": self.pool,
            "weight": repr(self.weight),
            "max_queued": str(self.quotas.max_queued),
            "max_in_flight": str(self.quotas.max_in_flight),
            "token_hash": token_hash,
            "created_at": repr(created_at),
        }

    @classmethod
    def of(cls, create: JobCreate) -> JobRecord:
        return cls(job=create.job, pool=create.pool, weight=create.weight, quotas=create.quotas)

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> JobRecord:
        text = {k.decode(): v.decode() for k, v in raw.items()}
        quotas = JobQuotas(max_queued=int(text["max_queued"]), max_in_flight=int(text["max_in_flight"]))
        return cls(job=text["job"], pool=text["pool"], weight=float(text["weight"]), quotas=quotas)


async def read_job(redis: Redis, job: str) -> JobRecord | None:
    raw: Any = await redis.hgetall(keys.job_record(job))
    return JobRecord.from_hash(raw) if raw else None


async def read_jobs(redis: Redis) -> list[JobRecord]:
    members: Any = await redis.smembers(keys.jobs_index())
    names = sorted(n.decode() for n in members)
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hgetall(keys.job_record(name))
        raws = await pipe.execute()
    return [JobRecord.from_hash(raw) for raw in raws if raw]


def decode_hash(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def int_field(values: dict[str, str], name: str) -> int:
    return int(values.get(name, "0") or 0)

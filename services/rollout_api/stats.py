"""Job and rollout figures, computed from the counters the scripts keep (``scripts.py``)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from services.protocol import InfraStage, Status, counters, keys
from services.protocol.api import JobStatus, RolloutStatus, TailFigures
from services.rollout_api.figures import percentile, rate_per_hour, ratio, tail_share
from services.rollout_api.records import JobRecord, decode_hash, int_field

RECENT_ROLLOUTS = 20  # complete rollouts averaged into a job's tail share
RATE_WINDOW = 1000  # latest finishes used for a job's throughput


def status_counts(values: dict[str, str]) -> dict[str, int]:
    return {s.value: int_field(values, f"status:{s.value}") for s in Status}


def _float(values: dict[str, str], name: str) -> float | None:
    raw = values.get(name)
    return float(raw) if raw else None


def rollout_tail(values: dict[str, str], durations: list[float]) -> TailFigures:
    trainable = int_field(values, f"status:{Status.COMPLETED.value}") + int_field(
        values, f"status:{Status.TRUNCATED.value}"
    )
    complete = int_field(values, "done") >= int_field(values, "total") > 0
    share = tail_share(float(values["created_at"]), _float(values, "t90"), _float(values, "last_finish"))
    return TailFigures(
        episode_p50_s=percentile(durations, 50),
        episode_p99_s=percentile(durations, 99),
        tail_share_after_90pct=share if complete else None,
        turn_cap_hit_rate=ratio(int_field(values, "turn_cap"), trainable),
    )


async def rollout_status(redis: Redis, job: str, rollout_id: str) -> RolloutStatus | None:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.rollout_record(job, rollout_id))
        pipe.lrange(keys.rollout_episodes(job, rollout_id), 0, -1)
        raw, durations = await pipe.execute()
    if not raw:
        return None
    values = decode_hash(raw)
    return RolloutStatus(
        rollout_id=rollout_id,
        job=job,
        total=int_field(values, "total"),
        queued=max(0, int_field(values, "queued")),
        in_flight=max(0, int_field(values, "in_flight")),
        finished=int_field(values, "done"),
        by_status=status_counts(values),
        cancelled=values.get("cancelled") == "1",
        tail=rollout_tail(values, [float(d) for d in durations]),
        mode=values.get("mode") or "train",
    )


async def _recent_tail_share(redis: Redis, job: str) -> float | None:
    ids: Any = await redis.zrevrange(keys.rollout_index(job), 0, RECENT_ROLLOUTS - 1)
    async with redis.pipeline(transaction=False) as pipe:
        for rid in ids:
            pipe.hmget(keys.rollout_record(job, rid.decode()), ["created_at", "t90", "last_finish", "done", "total"])
        rows = await pipe.execute()
    shares = []
    for created, t90, last, done, total in rows:
        if created and t90 and last and int(done or 0) >= int(total or 1):
            share = tail_share(float(created), float(t90), float(last))
            if share is not None:
                shares.append(share)
    return sum(shares) / len(shares) if shares else None


async def job_status(redis: Redis, record: JobRecord) -> JobStatus:
    job = record.job
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.job_stats(job))
        pipe.lrange(keys.job_recent(job), 0, -1)
        raw, recent = await pipe.execute()
    values = decode_hash(raw)
    rows = [line.decode().split() for line in recent]
    durations = [float(r[1]) for r in rows]
    finished = int_field(values, "finished")
    counts = status_counts(values)
    trainable = counts[Status.COMPLETED.value] + counts[Status.TRUNCATED.value]
    tail = TailFigures(
        episode_p50_s=percentile(durations, 50),
        episode_p99_s=percentile(durations, 99),
        tail_share_after_90pct=await _recent_tail_share(redis, job),
        turn_cap_hit_rate=ratio(int_field(values, "turn_cap"), trainable),
    )
    return JobStatus(
        job=job,
        pool=record.pool,
        weight=record.weight,
        quotas=record.quotas,
        queue_depth=max(0, int_field(values, "queued")),
        in_flight=max(0, int_field(values, "in_flight")),
        finished=finished,
        trajectories_per_hour=rate_per_hour([float(r[0]) for r in rows[:RATE_WINDOW]]),
        by_status=counts,
        infra_failed_attempts_by_stage={
            s.value: int_field(values, counters.failed_attempts(s.value)) for s in InfraStage
        },
        infra_error_trajectories_by_stage={
            s.value: int_field(values, counters.infra_error_trajectories(s.value)) for s in InfraStage
        },
        infra_error_rate=ratio(counts[Status.INFRA_ERROR.value], finished),
        tail=tail,
    )

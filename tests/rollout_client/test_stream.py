"""The consumer group against a real Redis: every trajectory is delivered once, an unacknowledged
one comes back after a crash (to another process of the same group), an acknowledged one never does;
the async consumer shares the group's state with the sync one."""

from __future__ import annotations

import httpx
import pytest
import redis
import redis.asyncio

from rollout_client.errors import (
    BadRequest,
    JobGone,
    NotFound,
    QuotaExceeded,
    RolloutApiError,
    Unauthorized,
    Unavailable,
    api_error,
    error_class,
)
from rollout_client.http import RolloutClient
from rollout_client.stream import AsyncTrajectoryConsumer, TrajectoryConsumer
from services.protocol import keys
from services.protocol.errors import ErrorBody
from services.protocol.status import ErrorCode
from services.protocol.trajectory import to_stream_fields
from tests.trainer.factories import make_trajectory


def publish(client: redis.Redis, job: str, n: int, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        traj = make_trajectory("g", i, job=job)
        ids.append(client.xadd(keys.trajectory_stream(job), to_stream_fields(traj)).decode())  # type: ignore[arg-type, union-attr]
    return ids


def test_exactly_once_across_a_crash(redis_client: redis.Redis) -> None:
    first = TrajectoryConsumer(redis_client, "j", consumer="a")
    first.ensure_group()
    first.ensure_group()  # idempotent
    publish(redis_client, "j", 5)
    got = first.read(count=3, block_ms=10)
    assert [e.trajectory.sample_index for e in got if e.trajectory] == [0, 1, 2]
    assert first.ack([got[0].entry_id]) == 1 and first.pending_count() == 2
    # the process dies holding t1 and t2; its successor reclaims them before reading new entries
    second = TrajectoryConsumer(redis_client, "j", consumer="b")
    second.ensure_group()
    replay = second.reclaim()
    assert [e.trajectory.sample_index for e in replay if e.trajectory] == [1, 2]
    fresh = second.read(count=10, block_ms=10)
    assert [e.trajectory.sample_index for e in fresh if e.trajectory] == [3, 4]
    assert second.ack(e.entry_id for e in [*replay, *fresh]) == 4
    assert second.pending_count() == 0 and second.reclaim() == [] and second.read(10, 10) == []


def test_an_undecodable_entry_is_delivered_as_malformed(redis_client: redis.Redis) -> None:
    consumer = TrajectoryConsumer(redis_client, "j")
    consumer.ensure_group()
    redis_client.xadd(keys.trajectory_stream("j"), {"body": b"\x00not msgpack"})
    [entry] = consumer.read(count=10, block_ms=10)
    assert entry.trajectory is None and consumer.last_entry_id == entry.entry_id


async def test_the_async_consumer_shares_the_group(redis_url: str, redis_client: redis.Redis) -> None:
    sync = TrajectoryConsumer(redis_client, "j", consumer="a")
    sync.ensure_group()
    publish(redis_client, "j", 3)
    held = sync.read(count=1, block_ms=10)  # t0, never acknowledged
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        consumer = AsyncTrajectoryConsumer(client, "j", consumer="b")
        await consumer.ensure_group()
        replay = await consumer.reclaim()
        assert [e.entry_id for e in replay] == [held[0].entry_id]
        fresh = await consumer.read(count=10, block_ms=10)
        assert [e.trajectory.sample_index for e in fresh if e.trajectory] == [1, 2]
        assert await consumer.ack(e.entry_id for e in [*replay, *fresh]) == 3
        assert await consumer.pending_count() == 0
    finally:
        await client.aclose()


def test_errors_are_typed_after_the_codes() -> None:
    assert error_class(404, ErrorCode.UNKNOWN_JOB) is NotFound
    assert error_class(401, ErrorCode.UNAUTHORIZED) is Unauthorized
    assert error_class(429, ErrorCode.QUOTA_EXCEEDED) is QuotaExceeded
    assert error_class(422, ErrorCode.VALIDATION_ERROR) is BadRequest
    for code in ErrorCode:
        assert issubclass(error_class(code.http_status, code), RolloutApiError)
        assert (error_class(code.http_status, code) is Unavailable) == code.infra, code
    assert error_class(502, None) is Unavailable and error_class(418, None) is BadRequest
    body = ErrorBody.of(ErrorCode.CAPACITY_EXHAUSTED, "full", retry_after_s=2.0)
    err = api_error(503, body, body.model_dump_json())
    assert isinstance(err, Unavailable) and err.infra and err.retry_after_s == 2.0
    assert err.code is ErrorCode.CAPACITY_EXHAUSTED and "capacity_exhausted" in str(err)


def test_a_vanished_job_is_job_gone_not_nogroup(redis_client: redis.Redis) -> None:
    """The store restarted empty under a reader: every call says the job is gone (issue 29)."""
    consumer = TrajectoryConsumer(redis_client, "vanishing")
    consumer.ensure_group()
    publish(redis_client, "vanishing", 1)
    assert len(consumer.read(count=10, block_ms=10)) == 1
    redis_client.flushall()
    publish(redis_client, "vanishing", 1)  # a late record recreates the stream, without the group
    for call in (lambda: consumer.read(10, 10), consumer.reclaim, consumer.pending_count):
        with pytest.raises(JobGone) as gone:
            call()
        assert gone.value.code is ErrorCode.UNKNOWN_JOB and "vanishing" in str(gone.value)
        assert isinstance(gone.value, NotFound) and not gone.value.infra


def test_the_http_stream_raises_job_gone_on_its_error_event() -> None:
    body = ErrorBody.of(ErrorCode.UNKNOWN_JOB, "job 'x' no longer exists", field="job").model_dump_json()
    sse = f"retry: 1000\n\n: keep-alive\n\nevent: error\ndata: {body}\n\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=sse))
    client = RolloutClient("http://api.invalid", token="t")
    client.http = httpx.Client(base_url="http://api.invalid", transport=transport)
    with pytest.raises(JobGone) as gone:
        list(client.trajectories("x"))
    assert gone.value.code is ErrorCode.UNKNOWN_JOB
    client.close()

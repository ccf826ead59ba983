"""The cluster client behind ``redis+cluster://``: chosen by URL, one job's keys in one slot (so its
scripts and transactions run), a transaction across two jobs refused by Redis, and a bounded
client that waits (counted) for a free slot instead of failing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError

from services.protocol import keys
from services.protocol.redis_url import RedisTarget, redis_target
from services.runtime.redis_cluster import EmbeddedRedisCluster
from services.runtime.redis_pool import ObservedCluster, ObservedPool, open_redis, pool_of
from services.runtime.settings import RedisSettings
from services.runtime.sync_redis import open_sync_redis


def test_the_url_scheme_selects_the_cluster_client() -> None:
    assert redis_target("redis+cluster://:pw@10.0.0.1:7000") == RedisTarget("redis://:pw@10.0.0.1:7000", True)
    assert redis_target("rediss+cluster://h:7000") == RedisTarget("rediss://h:7000", True)
    assert redis_target("redis://h:6379/0") == RedisTarget("redis://h:6379/0", False)
    assert redis_target("unix:///run/redis.sock") == RedisTarget("unix:///run/redis.sock", False)
    assert isinstance(pool_of(open_redis("redis://127.0.0.1:1/0")), ObservedPool)
    assert isinstance(open_redis("redis+cluster://127.0.0.1:1"), ObservedCluster)  # connects lazily


def test_one_jobs_transaction_runs_and_two_jobs_are_refused(redis_cluster_url: str) -> None:
    client = open_sync_redis(redis_cluster_url)
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.job_stats("a"), "queued", 1)
            pipe.xadd(keys.work_stream("a"), {"item": b"x"})
            pipe.hset(keys.rollout_record("a", "r1"), "total", 1)
            assert pipe.execute()[0] == 1
        with pytest.raises((RedisClusterException, ResponseError)), client.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.job_stats("a"), "queued", 1)
            pipe.hincrby(keys.job_stats("b"), "queued", 1)
            pipe.execute()
    finally:
        client.close()


def test_a_full_cluster_client_waits_then_times_out_counted(redis_cluster_url: str) -> None:
    settings = RedisSettings(pool_wait_s=0.3)

    async def run() -> dict[str, int]:
        client = open_redis(redis_cluster_url, settings, size=1)
        try:

            async def read() -> None:
                await client.xread({keys.work_stream("w"): "$"}, block=1500)

            blocking = asyncio.create_task(read())
            await asyncio.sleep(0.2)  # the only slot is held by the blocking read
            with pytest.raises(RedisConnectionError, match="No connection available"):
                await client.get(keys.job_stats("w"))
            await blocking
            async with client.pipeline(transaction=True) as pipe:  # a pipeline takes the slot too
                pipe.set(keys.job_stats("w"), 1)
                await pipe.execute()
            figures = pool_of(client)
            assert figures is not None
            return figures.figures()
        finally:
            await client.aclose()

    figures = asyncio.run(run())
    assert (figures["limit"], figures["waits"], figures["wait_timeouts"], figures["in_use"]) == (1, 1, 1, 0)


def test_the_fixture_cluster_has_three_masters(redis_cluster: EmbeddedRedisCluster) -> None:
    client = open_sync_redis(redis_cluster.url)
    try:
        info: Any = client.cluster_info()  # type: ignore[attr-defined]
    finally:
        client.close()
    assert info["cluster_state"] == "ok" and int(info["cluster_size"]) == 3

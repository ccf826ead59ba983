"""A Redis that came back empty is told from one that was away by the store's generation
(``services/runtime/generation.py``): every service that saw the old one notices, once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
import redis
from redis.asyncio import Redis

from services.protocol import keys
from services.runtime.generation import StoreGeneration


def test_every_service_notices_a_store_that_lost_its_state_once(
    redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, api = StoreGeneration("proxy"), StoreGeneration("api")
    assert not proxy.observe(redis_client) and not api.observe(redis_client)  # the first look sets it
    assert proxy.seen == api.seen and not proxy.observe(redis_client)  # the same store: nothing lost
    assert api.health() == {}
    redis_client.flushall()  # what a restart without persistence leaves
    with caplog.at_level(logging.WARNING):
        assert proxy.observe(redis_client)  # finds it gone and sets another
        assert api.observe(redis_client)  # finds another than it saw
        assert not proxy.observe(redis_client) and not api.observe(redis_client)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["proxy", "api"]  # said once each
    assert api.health()["store_lost"]["times"] == 1


async def until(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never held")


def test_following_the_generation_from_an_asyncio_service(redis_url: str, redis_client: redis.Redis) -> None:
    async def follow_through_a_loss() -> StoreGeneration:
        client = Redis.from_url(redis_url)
        worker = StoreGeneration("worker")
        task = asyncio.create_task(worker.follow(client, 0.02))
        await until(lambda: worker.seen is not None)
        await client.delete(keys.store_generation())
        await until(lambda: worker.losses > 0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
        return worker

    worker = asyncio.run(asyncio.wait_for(follow_through_a_loss(), 10))
    assert worker.losses == 1 and worker.seen == redis_client.get(keys.store_generation()).decode()  # type: ignore[union-attr]

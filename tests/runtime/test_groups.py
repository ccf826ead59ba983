"""One consumer-group creation for the sync and the async Redis client."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from services.runtime.groups import ensure_group, ensure_group_async


def test_creating_a_group_twice_keeps_it_and_its_position(redis_client: redis.Redis) -> None:
    redis_client.xadd("s", {"a": "1"})
    ensure_group(redis_client, "s", "g")
    assert redis_client.xreadgroup("g", "c", {"s": ">"})  # reads from the first entry
    ensure_group(redis_client, "s", "g")  # exists: no error, the group is not reset
    assert not redis_client.xreadgroup("g", "c", {"s": ">"}, block=None)


def test_other_errors_propagate(redis_client: redis.Redis) -> None:
    redis_client.set("not-a-stream", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        ensure_group(redis_client, "not-a-stream", "g")


async def test_the_async_client_behaves_the_same(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await ensure_group_async(client, "as", "g")
        await ensure_group_async(client, "as", "g")
        assert await client.xinfo_groups("as")
        await client.set("as-str", "x")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await ensure_group_async(client, "as-str", "g")
    finally:
        await client.aclose()

"""Dead workers' consumers leave the work group; a consumer that still holds items never does."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
from redis.asyncio import Redis

from services.protocol.keys import WORKERS_GROUP
from services.rollout_api.worker.worker import remove_dead_consumers


def test_only_silent_consumers_holding_nothing_are_removed(redis_url: str, redis_client: redis.Redis) -> None:
    stream = "rollout:job:{consumers}:work"
    redis_client.xgroup_create(stream, WORKERS_GROUP, id="0", mkstream=True)
    for _ in range(2):
        redis_client.xadd(stream, {"item": b"x"})
    gone: Any = redis_client.xreadgroup(WORKERS_GROUP, "gone", {stream: ">"}, count=1)
    redis_client.xack(stream, WORKERS_GROUP, gone[0][1][0][0])  # finished its item, then died
    redis_client.xreadgroup(WORKERS_GROUP, "holding", {stream: ">"}, count=1)  # died holding one: reclaimable
    time.sleep(0.3)  # both silent past idle_s below
    redis_client.xreadgroup(WORKERS_GROUP, "me", {stream: ">"}, count=1)  # the caller, just active

    async def remove() -> list[str]:
        client = Redis.from_url(redis_url)
        try:
            return await remove_dead_consumers(client, stream, "me", idle_s=0.2)
        finally:
            await client.aclose()

    assert asyncio.run(remove()) == ["gone"]
    consumers: Any = redis_client.xinfo_consumers(stream, WORKERS_GROUP)
    names = {c["name"] for c in consumers}
    assert names == {b"holding", b"me"} or names == {"holding", "me"}

"""The blocking Redis client of the trainer and the command-line tools: one server, or a Redis
Cluster when the URL says ``redis+cluster://`` (``services.protocol.redis_url``). Imports only
redis-py and the contract, so the trainer may use it."""

from __future__ import annotations

from typing import cast

import redis

from services.protocol.redis_url import redis_target


def open_sync_redis(url: str) -> redis.Redis:
    """A client for ``url``; a cluster client is typed as ``redis.Redis`` (it has the same commands)."""
    target = redis_target(url)
    if target.cluster:
        return cast(redis.Redis, redis.RedisCluster.from_url(target.url))
    return redis.Redis.from_url(target.url)

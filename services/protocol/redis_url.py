"""Which Redis client a URL asks for: one server, or a Redis Cluster.

``redis://`` / ``rediss://`` (and ``unix://``) name one server. ``redis+cluster://`` /
``rediss+cluster://`` name a Redis Cluster by one of its nodes (the seed); the client discovers the
others. Every service and the trainer read ``ROLLOUT_REDIS_URL`` through this one rule, so the
same setting selects the cluster everywhere. A cluster has only database 0.
"""

from __future__ import annotations

from dataclasses import dataclass

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    url: str  # what redis-py's ``from_url`` takes (the cluster marker removed)
    cluster: bool  # True: use ``RedisCluster``


def redis_target(url: str) -> RedisTarget:
    """Split the cluster marker off ``url``; ``redis+cluster://h:p`` -> (``redis://h:p``, cluster)."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if not sep or plain is None:
        return RedisTarget(url, cluster=False)
    return RedisTarget(f"{plain}://{rest}", cluster=True)

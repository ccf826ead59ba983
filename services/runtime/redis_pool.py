"""Redis clients whose connection pool is sized on purpose, waits instead of failing, and shows
itself in ``/metrics``.

redis-py's defaults are two hidden caps: a pool of 100 connections that raises
``MaxConnectionsError`` past that (an API with 200 SSE subscribers answered 500), and a 5 s socket
timeout that kills every blocking read of 5 s or more (an idle SSE stream closed after 5 s). Here
the pool blocks up to ``pool_wait_s`` for a free connection, counting the waits and the waits that
timed out, and the socket timeout is longer than any blocking read the platform issues.

A ``redis+cluster://`` URL (``services.protocol.redis_url``) gives a Redis Cluster client instead,
with the same guarantees: redis-py's cluster client raises past ``max_connections`` per node, so
:class:`ObservedCluster` lets at most ``pool_size`` commands and pipelines hold a connection at
once and makes the rest wait (counted) for up to ``pool_wait_s``. Every multi-key command, script
and transaction of the platform names the keys of one hash tag (``services.protocol.keys``), so
each runs on one node. Clients are typed as :class:`Redis`: the cluster client has the same
command methods.

Cancellation: on Python 3.11, redis-py writes each command under ``asyncio.wait_for``, which
returns the write's result and drops a cancellation that arrives just as the write completes: the
cancelled task carries on (a broker's reaper loop did, and its graceful stop hung until SIGKILL).
:class:`CancelSafeConnection` writes under ``asyncio.timeout`` instead, which passes a foreign
cancellation on. (redis-py 8 sets a socket timeout by default: its clients all take that path.)
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol, cast

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.asyncio import BlockingConnectionPool, Connection, Redis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.protocol.redis_url import redis_target
from services.runtime.settings import RedisSettings

MAX_BLOCK_S = 30.0  # no blocking read (XREAD BLOCK ...) may ask for longer than this


class Observed(Protocol):
    def figures(self) -> dict[str, int]: ...


class CancelSafeConnection(Connection):
    """A connection whose writes never swallow the cancellation of the task that writes."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        if not timeout or sys.version_info >= (3, 12):  # 3.12's wait_for is built on asyncio.timeout
            await super().send_packed_command(command, check_health)
            return
        try:
            async with asyncio.timeout(timeout):  # bounds the (re)connect and the health check too
                self.socket_timeout = None  # redis-py then writes without wait_for
                try:
                    await super().send_packed_command(command, check_health)
                finally:
                    self.socket_timeout = timeout
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None


class ObservedPool(BlockingConnectionPool):
    """A blocking pool that counts how often a caller had to wait and how often the wait ran out.

    An idle connection with nobody waiting for one is handed out directly (checked like every
    connection the pool gives); redis-py's blocking path (a condition, a timeout, its own wait-time
    observation) is taken only when a caller may have to wait, so the common case costs less CPU
    per command."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.waits = 0
        self.wait_timeouts = 0
        self._blocking = 0  # callers inside the blocking path (they go first)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._available_connections and not self._blocking and not getattr(self, "_in_maintenance", False):
            return await self._take_idle()
        if not self.can_get_connection():
            self.waits += 1
        self._blocking += 1
        try:
            return await super().get_connection()  # type: ignore[no-untyped-call]
        except RedisConnectionError as exc:
            if "No connection available" in str(exc):
                self.wait_timeouts += 1
            raise
        finally:
            self._blocking -= 1

    async def _take_idle(self) -> Any:
        connection = self.get_available_connection()  # type: ignore[no-untyped-call]
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    def figures(self) -> dict[str, int]:
        in_use = len(self._in_use_connections)
        return {
            "in_use": in_use,
            "idle": len(self._available_connections),
            "limit": self.max_connections,
            "waits": self.waits,
            "wait_timeouts": self.wait_timeouts,
        }


class ObservedCluster(RedisCluster):
    """A cluster client on which at most ``limit`` commands or pipelines run at once; the rest wait."""

    def __init__(self, *, limit: int, wait_s: float, **kwargs: Any) -> None:
        super().__init__(max_connections=limit + 8, **kwargs)  # + pub/sub and topology refreshes
        self.limit = limit
        self.wait_s = wait_s
        self.waits = 0
        self.wait_timeouts = 0
        self._free = asyncio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """One of the ``limit`` slots, waited for (counted) up to ``wait_s``."""
        if self._free.locked():
            self.waits += 1
        try:
            await asyncio.wait_for(self._free.acquire(), self.wait_s)
        except TimeoutError:
            self.wait_timeouts += 1
            raise RedisConnectionError(f"No connection available after {self.wait_s:g} s") from None
        try:
            yield
        finally:
            self._free.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.held():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported in cluster mode")
        return _HeldPipeline(self, transaction)  # type: ignore[abstract]

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close every node's connections (``close_connection_pool``: accepted like ``Redis.aclose``)."""
        await super().aclose()

    def figures(self) -> dict[str, int]:
        nodes = self.nodes_manager.nodes_cache.values()
        return {
            "in_use": self.limit - self._free._value,
            "idle": sum(len(node._free) for node in nodes),
            "limit": self.limit,
            "waits": self.waits,
            "wait_timeouts": self.wait_timeouts,
        }


class _HeldPipeline(ClusterPipeline):
    cluster_client: ObservedCluster

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        async with self.cluster_client.held():
            return await super().execute(raise_on_error, allow_redirections)


def open_redis(url: str, settings: RedisSettings | None = None, *, size: int | None = None) -> Redis:
    """A client on its own observed pool (``size`` overrides ``settings.pool_size``); a cluster
    client when ``url`` has the ``redis+cluster://`` scheme."""
    s = settings or RedisSettings()
    if s.socket_timeout_s <= MAX_BLOCK_S:
        raise ValueError(f"socket_timeout_s must exceed the longest blocking read ({MAX_BLOCK_S:g} s)")
    target = redis_target(url)
    timeouts: dict[str, Any] = {
        "socket_timeout": s.socket_timeout_s, "socket_connect_timeout": s.connect_timeout_s,
        "health_check_interval": 30,
    }  # fmt: skip
    if target.cluster:
        cluster = ObservedCluster.from_url(target.url, limit=size or s.pool_size, wait_s=s.pool_wait_s, **timeouts)
        return cast(Redis, cluster)
    if target.url.startswith("redis://"):  # TLS and unix sockets keep redis-py's own connection classes
        timeouts["connection_class"] = CancelSafeConnection
    pool = ObservedPool.from_url(target.url, max_connections=size or s.pool_size, timeout=s.pool_wait_s, **timeouts)
    return Redis(connection_pool=pool)


def pool_of(client: Redis) -> Observed | None:
    """What ``/metrics`` reads about the client's connections (None: an unobserved client)."""
    if isinstance(client, ObservedCluster):
        return client
    pool = client.connection_pool
    return pool if isinstance(pool, ObservedPool) else None


class SaturationCollector(Collector):
    """``/metrics`` families for every named Redis pool (used, idle, limit, waits, wait timeouts)."""

    def __init__(self, service: str, clients: dict[str, Redis]) -> None:
        self.service = service
        self.clients = clients

    def collect(self) -> Iterator[Any]:
        labels = ["service", "pool"]
        used = GaugeMetricFamily(
            "rollout_redis_pool_connections", "Connections held, by state", labels=[*labels, "state"]
        )
        limit = GaugeMetricFamily("rollout_redis_pool_limit", "Most connections the pool opens", labels=labels)
        waits = CounterMetricFamily("rollout_redis_pool_waits", "Callers that waited for a connection", labels=labels)
        timeouts = CounterMetricFamily(
            "rollout_redis_pool_wait_timeouts", "Waits for a connection that ran out", labels=labels
        )
        for name, client in self.clients.items():
            pool = pool_of(client)
            if pool is None:
                continue
            f = pool.figures()
            used.add_metric([self.service, name, "in_use"], f["in_use"])
            used.add_metric([self.service, name, "idle"], f["idle"])
            limit.add_metric([self.service, name], f["limit"])
            waits.add_metric([self.service, name], f["waits"])
            timeouts.add_metric([self.service, name], f["wait_timeouts"])
        yield from (used, limit, waits, timeouts)


def observe_pools(registry: CollectorRegistry, service: str, clients: dict[str, Redis]) -> None:
    """Export the pools of ``clients`` (and the process's open files / limit) in ``registry``."""
    registry.register(SaturationCollector(service, clients))
    with contextlib.suppress(ValueError):  # already there (an app started twice in one process)
        ProcessCollector(registry=registry)  # process_open_fds / process_max_fds: file-descriptor saturation

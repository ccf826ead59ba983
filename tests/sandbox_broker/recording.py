"""Brokers in-process over real Redis, with a backend that only records calls (no sandboxes needed):
the ``make_broker`` fixture (``conftest.py``) and what its tests observe them with."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis

from services.protocol.sandboxes import Resources
from services.sandbox_broker.backends.base import Backend, Sandbox
from services.sandbox_broker.broker import Broker
from services.sandbox_broker.leases import LeaseStore
from services.sandbox_broker.metrics import BrokerMetrics
from services.sandbox_broker.pools import Pool, PoolKey
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import Templates, default_template

KEY = PoolKey.of("default", Resources())


class RecordingBackend:
    name = "local"

    def __init__(self) -> None:
        self.destroyed: list[str] = []
        self.present: list[Sandbox] = []
        self.lost: set[str] = set()  # sandboxes whose keepalive fails (an E2B sandbox that timed out)

    async def keepalive(self, sandbox_id: str, ttl_s: float) -> None:
        if sandbox_id in self.lost:
            raise OSError(f"no sandbox {sandbox_id}")

    async def destroy(self, sandbox_id: str) -> None:
        self.destroyed.append(sandbox_id)

    async def close(self) -> None:
        return None

    async def list_sandboxes(self) -> list[Sandbox]:
        return list(self.present)


InProcessFactory = Callable[..., Awaitable[Broker]]


@contextlib.asynccontextmanager
async def in_process_brokers(redis_url: str) -> AsyncIterator[InProcessFactory]:
    """Make brokers (closed at the end): ``pooled`` sandbox ids in the default pool, ``cache``: the
    lease cache subscribed, other keywords: settings."""
    made: list[Broker] = []

    async def make(pooled: Sequence[str] = (), cache: bool = False, **settings: Any) -> Broker:
        s = BrokerSettings(allow_anonymous=True, instance=f"b{len(made)}", **settings)
        client = aioredis.Redis.from_url(redis_url)
        store = LeaseStore(client, s.ttl_grace_s)
        broker = Broker(s, cast(Backend, RecordingBackend()), store, Templates(client, default_template(s), "local"),
                        BrokerMetrics())  # fmt: skip
        pool = broker.pools._pools[KEY] = Pool(KEY, target=len(pooled))  # no refill task: the test's sandboxes only
        pool.ready.extend(Sandbox(i, {}) for i in pooled)
        await broker.templates.get("default")  # read once (then cached), so it is not counted below
        if cache:
            broker.cache.start()
            await until(lambda: broker.cache.subscribed)
        made.append(broker)
        return broker

    try:
        yield make
    finally:
        for broker in made:
            await broker.close()
            broker.store.close()
            await broker.store.client.aclose()


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Wait for something another connection delivers (no assertion on how long it took)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never became true"
        await asyncio.sleep(0.01)


def count_commands(store: LeaseStore) -> list[str]:
    """The commands the store sends from here on (each one round trip), over its redis-py client
    and over its pipelined connection."""
    sent: list[str] = []
    client = store.client
    execute: Callable[..., Awaitable[Any]] = client.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]).lower())
        return await execute(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    if store.link is not None:
        link_send = store.link.send

        def sent_on_link(*args: Any) -> Any:
            sent.append(str(args[0]).lower())
            return link_send(*args)

        store.link.send = sent_on_link  # type: ignore[method-assign]
    return sent

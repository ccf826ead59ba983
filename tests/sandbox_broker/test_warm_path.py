"""The warm path: a take is a pop (no backend call), liveness is checked in the background, and
the refill target follows the observed lease rate."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from services.protocol.sandboxes import Resources
from services.sandbox_broker.backends.base import Backend, Sandbox
from services.sandbox_broker.metrics import BrokerMetrics
from services.sandbox_broker.pools import Pool, PoolKey, Pools

KEY = PoolKey.of("t", Resources())


class CountingBackend:
    """Records every call; ``dead`` sandboxes report not alive."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.dead: set[str] = set()
        self.destroyed: list[str] = []

    async def alive(self, sandbox_id: str) -> bool:
        self.calls.append("alive")
        return sandbox_id not in self.dead

    async def destroy(self, sandbox_id: str) -> None:
        self.destroyed.append(sandbox_id)

    async def keepalive(self, sandbox_id: str, ttl_s: float) -> None:
        self.calls.append("keepalive")


async def created(key: PoolKey) -> Sandbox:
    return Sandbox(f"sbx-{time.monotonic_ns()}", {})


def pools_with(backend: CountingBackend, ready: list[str]) -> tuple[Pools, Pool]:
    pools = Pools(cast(Backend, backend), BrokerMetrics(), created)
    pool = pools._pools[KEY] = Pool(KEY, target=len(ready))
    pool.ready.extend(Sandbox(i, {}) for i in ready)
    return pools, pool


async def test_a_take_makes_no_backend_call() -> None:
    backend = CountingBackend()
    pools, _ = pools_with(backend, ["a", "b"])
    taken = [pools.take(KEY), pools.take(KEY), pools.take(KEY)]
    assert [s.sandbox_id if s else None for s in taken] == ["a", "b", None]  # the third: a cold start
    assert backend.calls == []


async def test_dead_pooled_sandboxes_are_dropped_in_the_background() -> None:
    backend = CountingBackend()
    pools, pool = pools_with(backend, ["a", "b", "c"])
    backend.dead.add("b")
    await pools._check_liveness(pool)
    await asyncio.sleep(0)  # the destroy task runs
    assert [s.sandbox_id for s in pool.ready] == ["a", "c"] and backend.destroyed == ["b"]


def test_the_refill_target_follows_the_lease_rate() -> None:
    pool = Pool(KEY, target=4, create_s=2.0)
    now = time.monotonic()
    assert pool.demand(now) == 4  # no takes yet: the configured target
    pool.taken_at.extend(now - i * 0.1 for i in reversed(range(60)))  # 60 takes in 30 s = 2 per second
    assert pool.demand(now) == 8  # 2/s x 2 s per create x 2: capped at 4 x 4 = 16
    pool.taken_at.extend([now] * 600)
    assert pool.demand(now) == 16
    assert pool.demand(now + 100) == 4  # the window has passed


def test_queued_requests_raise_the_refill_target() -> None:
    backend = CountingBackend()
    pools, pool = pools_with(backend, ["a", "b"])
    now = time.monotonic()
    target = pool.target
    with pools.queued(KEY), pools.queued(KEY):
        assert pool.demand(now) == target + 2 and pool.wake.is_set()  # one more ready for each waiting request
        with pools.queued(None):  # a request no pool serves
            assert pool.demand(now) == target + 2
    assert pool.demand(now) == target and pool.queued == 0


async def test_the_liveness_check_lets_leases_in_and_spares_what_they_took() -> None:
    backend = CountingBackend()
    pools, pool = pools_with(backend, ["a", "b"])
    backend.dead.add("b")
    check = asyncio.create_task(pools._check_liveness(pool))
    await asyncio.sleep(0)  # the check looked at "a" and yields before the next one
    assert [pools.take(KEY), pools.take(KEY)] == [Sandbox("a", {}), Sandbox("b", {})]  # handed out meanwhile
    await check
    assert backend.destroyed == [] and list(pool.ready) == []  # "b" is a lease's now: not the pool's to destroy

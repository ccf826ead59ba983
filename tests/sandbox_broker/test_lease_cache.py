"""The warm path's one Redis round trip, the lease cache that spares an exec its Redis read, and the
orphan sweep that must not take a sandbox being handed out: brokers in-process over real Redis,
with a backend that only records calls (no sandboxes needed; ``recording.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Lease, LeaseRequest, Resources
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import LABEL_BROKER, LABEL_POOL, Sandbox
from services.sandbox_broker.lease_cache import LeaseCache
from services.sandbox_broker.leases import LeaseRecord
from services.sandbox_broker.reaper import Reaper
from tests.sandbox_broker.recording import KEY, InProcessFactory, RecordingBackend, count_commands, until


async def test_a_warm_lease_is_admitted_and_recorded_in_one_round_trip(make_broker: InProcessFactory) -> None:
    broker = await make_broker(["warm-0", "warm-1"])
    await broker.create_lease(LeaseRequest(job="j"))  # loads the script into Redis (a first call only)
    sent = count_commands(broker.store)
    lease = await broker.create_lease(LeaseRequest(job="j"))
    assert lease.warm and lease.sandbox_id == "warm-1"
    assert sent == ["evalsha"]
    record = await broker.store.get(lease.id)
    assert record is not None and record.state == "live" and record.lease == lease
    assert await broker.store.count() == 2 and lease in await broker.store.list("j")
    assert broker.pools.owned() == set()  # settled: the leases' now, not the pool's


async def test_a_burst_of_leases_after_a_quiet_spell_reads_the_template_once(make_broker: InProcessFactory) -> None:
    broker = await make_broker([f"warm-{i}" for i in range(8)])
    await broker.create_lease(LeaseRequest(job="j"))  # the script loaded
    broker.templates._cache.clear()  # stale, as after CACHE_S without a lease
    sent = count_commands(broker.store)
    leases = await asyncio.gather(*(broker.create_lease(LeaseRequest(job="j")) for _ in range(7)))
    assert all(lease.warm for lease in leases)
    assert sent.count("hget") == 1  # one read for the burst, not one (and a pooled connection) per lease
    assert sent.count("evalsha") == 7


async def test_a_warm_lease_the_limits_refuse_goes_back_to_its_pool(make_broker: InProcessFactory) -> None:
    broker = await make_broker(["warm-1", "warm-2"], job_quota=1)
    first = await broker.create_lease(LeaseRequest(job="j"))
    with pytest.raises(PlatformError) as refused:
        await broker.create_lease(LeaseRequest(job="j", wait_s=0))
    assert refused.value.code == ErrorCode.QUOTA_EXCEEDED
    assert [s.sandbox_id for s in broker.pools._pools[KEY].ready] == ["warm-2"]  # first in line again
    assert await broker.store.count() == 1 and first.sandbox_id == "warm-1"
    other_job = await broker.create_lease(LeaseRequest(job="k"))
    assert other_job.warm and other_job.sandbox_id == "warm-2"
    hits = broker.metrics.pool_hits.labels(KEY.label)._value.get()
    assert hits == 2  # leases served from the pool, not takes


async def test_a_lease_released_on_another_replica_is_refused_here(make_broker: InProcessFactory) -> None:
    here, there = await make_broker(["warm-1"], cache=True), await make_broker(cache=True)
    lease = await here.create_lease(LeaseRequest())
    assert (await there.live(lease.id)).lease == lease  # read from Redis, kept
    assert (await there.live(lease.id)).lease == lease  # from the cache
    assert there.metrics.lease_cache_hits._value.get() == 1
    assert await here.release(lease.id)
    await until(lambda: there.cache.get(lease.id, time.time()) is None)  # the claim's announcement arrived
    with pytest.raises(PlatformError) as gone:
        await there.live(lease.id)
    assert gone.value.code == ErrorCode.LEASE_NOT_FOUND
    with pytest.raises(PlatformError):
        await here.live(lease.id)  # the releasing replica dropped it at once


async def test_the_orphan_sweep_spares_a_sandbox_handed_out_while_it_reads_the_leases(
    make_broker: InProcessFactory,
) -> None:
    broker = await make_broker(["warm-1"])
    backend = cast(RecordingBackend, broker.backend)
    labels = {LABEL_BROKER: broker.instance, LABEL_POOL: "1"}
    backend.present = [Sandbox("warm-1", labels, created_at=time.time() - 3600)]  # long past the grace
    read_leases = broker.store.live_sandbox_ids
    handed_out: list[Lease] = []

    async def leases_read_then_a_lease_made() -> set[str]:
        ids = await read_leases()  # read before the lease below is recorded...
        handed_out.append(await broker.create_lease(LeaseRequest()))  # ...which completes before the sweep goes on
        return ids

    broker.store.live_sandbox_ids = leases_read_then_a_lease_made  # type: ignore[method-assign]
    assert await Reaper(broker, broker.store.client).sweep_orphans() == 0
    assert handed_out[0].sandbox_id == "warm-1" and backend.destroyed == []


async def test_a_pool_create_slower_than_the_grace_is_not_an_orphan(make_broker: InProcessFactory) -> None:
    broker = await make_broker(create_timeout_s=120)
    backend = cast(RecordingBackend, broker.backend)
    labels = {LABEL_BROKER: broker.instance, LABEL_POOL: "1"}
    backend.present = [Sandbox("starting", labels, created_at=time.time() - 90),  # setup still running
                       Sandbox("lost", labels, created_at=time.time() - 400)]  # fmt: skip
    assert await Reaper(broker, broker.store.client).sweep_orphans() == 1
    assert backend.destroyed == ["lost"]


def _record(lease_id: str, expires_in_s: float = 600.0, state: str = "live") -> LeaseRecord:
    lease = Lease(id=lease_id, template="default", backend="local", job="j", sandbox_id="s",
                  expires_at=time.time() + expires_in_s, warm=True, start_s=0.0)  # fmt: skip
    return LeaseRecord(lease, "none", "b0", state)


def test_the_cache_keeps_nothing_it_cannot_trust() -> None:
    cache = LeaseCache(cast(aioredis.Redis, None))
    cache.put(_record("a"), cache.epoch)
    assert cache.get("a", time.time()) is None  # not subscribed: nothing is kept
    cache.subscribed = True
    epoch = cache.epoch
    cache.put(_record("a"), epoch)
    assert cache.get("a", time.time()) is not None
    cache.put(_record("b", expires_in_s=-1), epoch)
    assert cache.get("b", time.time()) is None  # past its expiry: read again
    cache.put(_record("c", state="closing"), epoch)
    assert cache.get("c", time.time()) is None  # being torn down
    cache.drop("d")
    cache.put(_record("d"), epoch)  # a read that was in flight when its end was announced
    assert cache.get("d", time.time()) is None
    cache.epoch += 1  # the subscription changed while this read was in flight
    cache.put(_record("e"), epoch)
    assert cache.get("e", time.time()) is None
    cache._unsubscribed()
    assert cache.get("a", time.time()) is None and len(cache) == 0  # lost the subscription: forget everything


async def test_a_redis_outage_while_a_lease_goes_live_is_waited_out(make_broker: InProcessFactory) -> None:
    """The sandbox is ready when Redis goes away: the broker records the lease once Redis answers
    again, instead of failing the request and leaving the lease reserved until its create deadline."""
    broker = await make_broker()
    backend = cast(RecordingBackend, broker.backend)

    async def create(spec: Any) -> Sandbox:
        return Sandbox("cold-1", dict(spec.labels))

    backend.create = create  # type: ignore[attr-defined]
    activate, tries = broker.store.activate, []

    async def away_twice(record: LeaseRecord) -> bool:
        tries.append(record.lease.id)
        if len(tries) <= 2:
            raise RedisConnectionError("Redis away")
        return await activate(record)

    broker.store.activate = away_twice  # type: ignore[method-assign]
    lease = await broker.create_lease(LeaseRequest(job="j", resources=Resources(cpus=0.5)))  # not the pool's: cold
    assert len(tries) == 3 and lease.sandbox_id == "cold-1"
    record = await broker.store.get(lease.id)
    assert record is not None and record.state == "live"
    assert backend.destroyed == [] and broker.pools.owned() == set()

"""Warm sandboxes claimed straight from Redis (``protocol/warm_offers.py``, the worker's
``warm_claims.py``, the pools' ``offers.py``): a real broker subprocess offers its pool on real
Redis, a worker's client claims leases with no broker request, and each claimed lease is the
broker's like any other (exec, listing, release, reaping). A sandbox goes to one lease only, the
limits hold, and a stopped broker's offers are never claimed."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import httpx
import pytest
import redis.asyncio as aioredis

from services.protocol import keys
from services.protocol.sandboxes import ExecRequest, Lease, LeaseRequest
from services.protocol.status import ErrorCode
from services.protocol.warm_offers import pool_label
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.warm_claims import WarmClaims
from services.runtime.net import free_port
from services.runtime.redis_pool import open_redis
from tests.sandbox_broker.conftest import BrokerFactory, needs_bwrap
from tests.support.processes import ServiceProcess

POOL = pool_label("default", LeaseRequest().resources)


def _pool_size(url: str, target: int, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    size = -1
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            size = sum(client.get("/healthz").json()["pools"].values())
            if size == target:
                return size
            time.sleep(0.05)
    return size


async def _pooled(start_broker: BrokerFactory, size: int, env: dict[str, str] | None = None) -> ServiceProcess:
    """A broker whose default template keeps ``size`` warm sandboxes, once they are all ready."""
    broker = start_broker("--warm-pool", str(size), env=env)
    assert await asyncio.to_thread(_pool_size, broker.url, size) == size
    return broker


@asynccontextmanager
async def _client(url: str, redis_url: str) -> AsyncIterator[tuple[BrokerClient, WarmClaims]]:
    store = open_redis(redis_url)
    claims = WarmClaims(store)
    async with aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 60.0, claims=claims)
        try:
            yield client, claims
        finally:
            await client.close()
            await store.aclose(close_connection_pool=True)


async def _until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Poll ``check`` until it holds (a bound for a test that would hang, not a timing)."""
    deadline = time.monotonic() + timeout_s
    for _ in itertools.count():
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.1)


async def _status(url: str) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(url)).status_code


async def _gone(url: str) -> bool:
    return await _status(url) == 404


async def _holds(length: Awaitable[int], expected: int) -> bool:
    return await length == expected


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'{name}{{pool="{POOL}"}}'):
            return float(line.split()[-1])
    return 0.0


@needs_bwrap
async def test_a_worker_claims_warm_leases_from_redis_and_the_broker_serves_them(
    start_broker: BrokerFactory, redis_url: str
) -> None:
    broker = await _pooled(start_broker, 3)
    async with _client(broker.url, redis_url) as (client, claims):
        first, second = await asyncio.gather(*(client.lease(LeaseRequest(ttl_s=60, job="w1")) for _ in range(2)))
        assert claims.claimed == 2 and client.batcher.batches == 0  # no broker request made them
        assert first.warm and second.warm and first.sandbox_id != second.sandbox_id
        assert (first.job, first.template, first.backend) == ("w1", "default", "local")
        for lease in (first, second):
            assert (await client.exec(lease.id, ExecRequest(shell="echo hi", timeout_s=30))).stdout == "hi\n"
        async with httpx.AsyncClient() as http:
            listed = (await http.get(f"{broker.url}/leases", params={"job": "w1"})).json()
        assert {item["id"] for item in listed} == {first.id, second.id}
        assert await asyncio.to_thread(_pool_size, broker.url, 3) == 3  # the broker saw the claims and refilled
        claimed, hits = await asyncio.to_thread(lambda: [_metric(broker.url, f"rollout_broker_pool_{name}_total")
                                                         for name in ("claims", "hits")])  # fmt: skip
        assert claimed == hits == 2.0
        await client.release(first.id)
        assert await _status(f"{broker.url}/leases/{first.id}") == 404
        # a claimed lease that is not renewed is reaped like any other
        short = await client.lease(LeaseRequest(ttl_s=1, job="w1"))
        assert claims.claimed == 3
        await _until("the reaper", lambda: _gone(f"{broker.url}/leases/{short.id}"))
        await client.release(second.id)


@needs_bwrap
async def test_claims_and_the_brokers_own_leases_never_share_a_sandbox(
    start_broker: BrokerFactory, redis_url: str
) -> None:
    broker = await _pooled(start_broker, 6)
    async with _client(broker.url, redis_url) as (client, claims), httpx.AsyncClient(base_url=broker.url) as direct:

        async def by_broker() -> Lease:
            answer = await direct.post("/leases", json={"job": "race", "ttl_s": 60, "wait_s": 60}, timeout=120)
            assert answer.status_code == 201, answer.text
            return Lease.model_validate(answer.json())

        # the claims' connection opened and their script loaded first (a claim no pool serves), so that
        # they race the broker's own leases from the start; which side wins how many varies with the load
        await claims.claim([LeaseRequest(template="no-pool", job="race")], lambda _, lease: None)
        asked = [client.lease(LeaseRequest(ttl_s=60, job="race", wait_s=60)) for _ in range(6)]
        leases = await asyncio.gather(*asked, *(by_broker() for _ in range(6)))
        assert len({lease.sandbox_id for lease in leases}) == 12  # each sandbox one lease's
        assert sum(lease.warm for lease in leases) >= 6  # the pool's 6 went to one side or the other
        for lease in leases:
            assert (await client.exec(lease.id, ExecRequest(shell="true", timeout_s=30))).exit_code == 0
            await client.release(lease.id)


@needs_bwrap
async def test_a_claim_stops_at_a_full_limit_and_leaves_the_rest_to_the_broker(
    start_broker: BrokerFactory, redis_url: str
) -> None:
    broker = await _pooled(start_broker, 3, {"ROLLOUT_BROKER_JOB_QUOTA": "2"})
    async with _client(broker.url, redis_url) as (client, claims):
        asked = [client.lease(LeaseRequest(ttl_s=60, job="q", wait_s=0.5)) for _ in range(3)]
        got = await asyncio.gather(*asked, return_exceptions=True)
        leases = [g for g in got if isinstance(g, Lease)]
        refused = [g for g in got if isinstance(g, InfraError)]
        assert claims.claimed == 2 and len(leases) == 2  # the job's quota, as the broker counts it
        assert len(refused) == 1 and refused[0].code is ErrorCode.QUOTA_EXCEEDED  # the broker's own answer
        for lease in leases:
            await client.release(lease.id)


@needs_bwrap
async def test_the_offers_of_a_stopped_broker_are_never_claimed(start_broker: BrokerFactory, redis_url: str) -> None:
    env = {"ROLLOUT_BROKER_REAP_INTERVAL_S": "0.5"}  # its instance key lives 2 s past its last heartbeat
    broker = await _pooled(start_broker, 2, env)
    store: aioredis.Redis = open_redis(redis_url)
    offers = keys.pool_offers(POOL, "b1")
    try:
        assert await store.llen(offers) == 2
        broker.kill()  # kill -9: its offers stay behind in Redis
        assert not broker.alive()
        await asyncio.sleep(2.5)  # its instance key expires
        claims = WarmClaims(store)
        got: list[Lease] = []
        await claims.claim([LeaseRequest(ttl_s=60, job="late")], lambda _, lease: got.append(lease))
        assert got == [] and claims.claimed == 0
        assert not await store.sismember(keys.pool_offerers(POOL), "b1")  # dropped from the pool's offerers
        assert await store.scard(keys.job_leases("late")) == 0
        claims.close()
        # the same replica started again drops what it offered before, then offers its new pool
        again = start_broker("--warm-pool", "2", env=env)
        assert await asyncio.to_thread(_pool_size, again.url, 2) == 2
        await _until("the new offers", lambda: _holds(store.llen(offers), 2))
        async with _client(again.url, redis_url) as (client, claims2):
            lease = await client.lease(LeaseRequest(ttl_s=60, job="late"))
            assert claims2.claimed == 1
            assert (await client.exec(lease.id, ExecRequest(shell="echo ok", timeout_s=30))).stdout == "ok\n"
            await client.release(lease.id)
    finally:
        await store.aclose(close_connection_pool=True)


@pytest.mark.parametrize("off", ["ROLLOUT_BROKER_WARM_OFFERS"])
@needs_bwrap
async def test_with_offers_off_nothing_is_offered_and_leases_go_to_the_broker(
    start_broker: BrokerFactory, redis_url: str, off: str
) -> None:
    broker = await _pooled(start_broker, 1, {off: "false"})
    async with _client(broker.url, redis_url) as (client, claims):
        lease = await client.lease(LeaseRequest(ttl_s=60, job="off"))
        assert claims.claimed == 0 and lease.warm  # the broker's own warm path
        await client.release(lease.id)


@needs_bwrap
async def test_no_claim_while_requests_wait_in_the_brokers_queue(start_broker: BrokerFactory, redis_url: str) -> None:
    broker = await _pooled(start_broker, 2)
    store: aioredis.Redis = open_redis(redis_url)
    try:
        # what the broker's pools say every 100 ms while its admission queue holds requests
        await store.set(keys.broker_waiting("b1"), "1", px=60_000)
        async with _client(broker.url, redis_url) as (client, claims):
            got: list[Lease] = []
            await claims.claim([LeaseRequest(ttl_s=60, job="wait")], lambda _, lease: got.append(lease))
            assert got == [] and await store.llen(keys.pool_offers(POOL, "b1")) == 2  # nothing taken
            await store.delete(keys.broker_waiting("b1"))
            lease = await client.lease(LeaseRequest(ttl_s=60, job="wait"))
            assert claims.claimed == 1 and lease.warm
            await client.release(lease.id)
    finally:
        await store.aclose(close_connection_pool=True)


@needs_bwrap
async def test_with_redis_out_of_reach_the_broker_serves_the_leases(start_broker: BrokerFactory) -> None:
    broker = await _pooled(start_broker, 2)
    unreachable = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    async with _client(broker.url, unreachable) as (client, claims):
        leases = await asyncio.gather(*(client.lease(LeaseRequest(ttl_s=60, job="away")) for _ in range(2)))
        assert claims.claimed == 0 and client.batcher.batches == 1  # the claim failed: one POST /leases/batch
        assert all(lease.warm for lease in leases)
        for lease in leases:
            await client.release(lease.id)


@needs_bwrap
async def test_a_replica_started_again_without_its_pool_leaves_no_offer_behind(
    start_broker: BrokerFactory, redis_url: str
) -> None:
    broker = await _pooled(start_broker, 2)
    store: aioredis.Redis = open_redis(redis_url)
    try:
        broker.kill()  # kill -9: its two offers stay behind, and the same name starts again at once
        start_broker("--warm-pool", "0")  # no pool this time, and its heartbeat is live
        assert await store.llen(keys.pool_offers(POOL, "b1")) == 0  # dropped at its start
        claims = WarmClaims(store)
        got: list[Lease] = []
        await claims.claim([LeaseRequest(ttl_s=60, job="gone")], lambda _, lease: got.append(lease))
        assert got == [] and await store.scard(keys.job_leases("gone")) == 0
        claims.close()
    finally:
        await store.aclose(close_connection_pool=True)


@needs_bwrap
async def test_healthz_counts_a_pool_without_the_sandboxes_workers_claimed(
    start_broker: BrokerFactory, redis_url: str
) -> None:
    broker = start_broker()
    async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
        # a refill takes 2 s at least (each runs the setup: none starts from a copy of another's)
        slow = {"name": "slow", "setup": ["sleep 2"], "warm_pool": 3, "share_setup": False}
        assert (await http.post("/templates", json=slow)).status_code == 201
        await _until("the pool", lambda: _sized(http, 3))
        async with _client(broker.url, redis_url) as (client, claims):
            got: list[Lease] = []
            asked = [LeaseRequest(template="slow", ttl_s=60, job="h")] * 2
            await claims.claim(asked, lambda _, lease: got.append(lease))
            assert len(got) == 2
            # at once, not at the pool's next look at its offers: what the bench's wait_pool relies on
            assert (await http.get("/healthz")).json()["pools"]["slow/1cpu/2048mb/10240mb/none"] == 1
            for lease in got:
                await client.release(lease.id)


async def _sized(http: httpx.AsyncClient, size: int) -> bool:
    pools: dict[str, int] = (await http.get("/healthz")).json()["pools"]
    return sum(pools.values()) == size

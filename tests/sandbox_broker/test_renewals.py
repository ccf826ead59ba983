"""Many leases renewed in one call (``POST /leases/renew``, ``Broker.renew_many``): one Redis script
for all of them, the uncached records read in one pipeline, and every id answered either renewed or
ended, exactly as renewing it alone would have answered 200 or 404. Brokers in-process over real
Redis (``recording.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from services.protocol.sandboxes import Lease, LeaseRequest
from services.protocol.status import ErrorCode
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker.agent import AgentDeps
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.proxy_client import ProxyClient
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.worker import Worker
from services.runtime.net import free_port
from services.sandbox_broker import leases
from services.sandbox_broker.broker import Broker
from tests.sandbox_broker.conftest import BrokerFactory, needs_bwrap
from tests.sandbox_broker.recording import InProcessFactory, RecordingBackend, count_commands, until


def _anyone(_: Lease) -> bool:
    return True


async def _expiry(broker: Broker, lease_id: str) -> float:
    record = await broker.store.get(lease_id)
    assert record is not None
    return record.lease.expires_at


async def test_live_leases_are_renewed_in_one_round_trip_and_the_rest_answered_ended(
    make_broker: InProcessFactory,
) -> None:
    broker = await make_broker(["s1", "s2", "s3"], cache=True)
    a, b, c = [await broker.create_lease(LeaseRequest(ttl_s=30)) for _ in range(3)]
    assert await broker.release(b.id)
    await broker.renew_many([a.id], 30, _anyone)  # loads the script into Redis (a first call only)
    sent = count_commands(broker.store)
    renewed = await broker.renew_many([a.id, b.id, c.id, "lse-nope", a.id], 900, _anyone)
    assert sent == ["evalsha"]  # records from the cache, all renewals in one script
    assert set(renewed.expires_at) == {a.id, c.id} and renewed.ended == [b.id, "lse-nope"]
    for lease in (a, c):
        assert renewed.expires_at[lease.id] > time.time() + 800
        assert await _expiry(broker, lease.id) == renewed.expires_at[lease.id]  # in Redis
        assert broker.cache.get(lease.id, time.time()) is not None
        assert (await broker.live(lease.id)).lease.expires_at == renewed.expires_at[lease.id]


async def test_another_replica_renews_leases_it_has_not_seen(make_broker: InProcessFactory) -> None:
    here, there = await make_broker(["s1", "s2"], cache=True), await make_broker(cache=True)
    a, b = [await here.create_lease(LeaseRequest(ttl_s=30)) for _ in range(2)]
    renewed = await there.renew_many([a.id, b.id], 900, _anyone)  # both read from Redis (one pipeline)
    assert set(renewed.expires_at) == {a.id, b.id} and renewed.ended == []
    assert await _expiry(here, a.id) > time.time() + 800
    assert there.cache.get(a.id, time.time()) is not None
    assert await here.release(a.id)
    await until(lambda: there.cache.get(a.id, time.time()) is None)  # the claim's announcement arrived
    assert (await there.renew_many([a.id, b.id], 900, _anyone)).ended == [a.id]


async def test_a_caller_renews_only_the_leases_it_may_see(make_broker: InProcessFactory) -> None:
    broker = await make_broker(["s1", "s2"])
    mine, theirs = await broker.create_lease(LeaseRequest(job="a")), await broker.create_lease(LeaseRequest(job="b"))
    before = await _expiry(broker, theirs.id)
    renewed = await broker.renew_many([mine.id, theirs.id], 3000, lambda lease: lease.job == "a")
    assert list(renewed.expires_at) == [mine.id] and renewed.ended == [theirs.id]
    assert await _expiry(broker, theirs.id) == before  # untouched


async def test_a_lease_whose_sandbox_cannot_be_kept_is_not_renewed(make_broker: InProcessFactory) -> None:
    broker = await make_broker(["s1", "s2"])
    kept, lost = await broker.create_lease(LeaseRequest()), await broker.create_lease(LeaseRequest())
    cast(RecordingBackend, broker.backend).lost.add(lost.sandbox_id)
    renewed = await broker.renew_many([kept.id, lost.id], 900, _anyone)
    assert list(renewed.expires_at) == [kept.id] and renewed.ended == [lost.id]


async def test_more_leases_than_one_script_takes(make_broker: InProcessFactory) -> None:
    n = leases.RENEW_CHUNK + 7
    broker = await make_broker([f"s{i}" for i in range(n)])
    ids = [(await broker.create_lease(LeaseRequest(ttl_s=30))).id for _ in range(n)]
    assert await broker.release(ids[-1])  # in the second script's share
    renewed = await broker.renew_many(ids, 900, _anyone)
    assert len(renewed.expires_at) == n - 1 and renewed.ended == [ids[-1]]
    assert min([await _expiry(broker, i) for i in ids[:-1]]) > time.time() + 800


# -- the worker's side: one call per heartbeat ---------------------------------------------------


@needs_bwrap
async def test_a_workers_heartbeat_renews_its_leases_in_one_call(start_broker: BrokerFactory, redis_url: str) -> None:
    broker = start_broker()
    redis = aioredis.Redis.from_url(redis_url)
    async with aiohttp.ClientSession() as session:
        client = BrokerClient(session, broker.url, 60.0)
        held = [await client.lease(LeaseRequest(ttl_s=30)) for _ in range(3)]
        await client.release(held[2].id)  # ended behind the worker's back
        settings = WorkerSettings(lease_ttl_s=900)
        unused = cast(ChatTokenizer, None), cast(ProxyClient, None)  # a heartbeat neither tokenizes nor generates
        deps = AgentDeps(proxy=unused[1], broker=client, tokenizer=unused[0], settings=settings, worker_id="w1",
                         metrics=WorkerMetrics(1), leases={h.id for h in held})  # fmt: skip
        worker = Worker(redis, deps, deps.metrics)
        await worker.heartbeat()
        tasks = set(worker.renewing.values())
        assert len(tasks) == 1 and set(worker.renewing) == deps.leases  # one call for all of them
        await asyncio.gather(*tasks)
        assert worker.renewing == {}
        async with session.get(f"{broker.url}/leases/{held[0].id}") as answer:
            assert (await answer.json())["expires_at"] > time.time() + 800
        assert await client.renew_many([held[1].id, held[2].id], 900) == [held[2].id]
        for lease in held[:2]:
            await client.release(lease.id)
        await client.close()
    await redis.aclose()


async def test_a_broker_without_the_route_gets_a_renewal_per_lease() -> None:
    """A worker upgraded before its broker: ``POST /leases/renew`` is 405 there (a real HTTP server
    answering as a broker of the previous version did)."""
    renewed: list[str] = []

    async def renew_one(request: web.Request) -> web.Response:
        lease_id = request.match_info["lease_id"]
        if lease_id == "gone":
            return web.json_response({"error": {"code": "lease_not_found", "message": "", "infra": False}}, status=404)
        if lease_id == "busy":
            busy = {"error": {"code": "backend_unavailable", "message": "", "infra": True}}
            return web.json_response(busy, status=503)
        renewed.append(lease_id)
        return web.json_response({})

    async def not_allowed(_: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "bad_request", "message": "", "infra": False}}, status=405)

    app = web.Application()
    app.router.add_post("/leases/renew", not_allowed)
    app.router.add_post("/leases/{lease_id}/renew", renew_one)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            client = BrokerClient(session, f"http://127.0.0.1:{port}", 10.0)
            assert await client.renew_many(["a", "gone", "b"], 60) == ["gone"]
            with pytest.raises(InfraError) as busy:  # a broker too busy to answer has not ended the lease
                await client.renew_many(["a", "busy"], 60)
            assert busy.value.code is ErrorCode.BACKEND_UNAVAILABLE
            await client.close()
        assert sorted(renewed) == ["a", "a", "b"]
    finally:
        await runner.cleanup()

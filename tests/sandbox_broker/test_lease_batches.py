"""The worker's lease coalescer (``worker/lease_batches.py``): leases asked for at the same moment go
out as one ``POST /leases/batch``, and each caller gets what its own ``POST /leases`` would have
given it. Against a real broker (a subprocess on real Redis and bubblewrap), and against a real HTTP
server answering as a broker of the previous version (no batch route) or a failing one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from services.protocol import InfraStage
from services.protocol.sandboxes import ExecRequest, Lease, LeaseRequest, Resources, SandboxSetup
from services.protocol.status import ErrorCode
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.warm_claims import Reply, WarmClaims
from services.runtime.net import free_port
from services.runtime.redis_pool import open_redis
from tests.sandbox_broker.conftest import BrokerFactory, needs_bwrap
from tests.support.http import serving


def _same_error(batched: object, alone: InfraError) -> InfraError:
    """``batched`` is raised as ``alone`` (the same request on ``POST /leases``) was."""
    assert isinstance(batched, InfraError), batched
    assert (batched.stage, batched.code, batched.retryable) == (alone.stage, alone.code, alone.retryable)
    return batched


async def _live(session: aiohttp.ClientSession, url: str, job: str) -> set[str]:
    async with session.get(f"{url}/leases", params={"job": job}) as answer:
        assert answer.status == 200
        return {lease["id"] for lease in await answer.json()}


@needs_bwrap
async def test_leases_asked_together_are_one_batch_and_each_caller_gets_its_own_answer(
    start_broker: BrokerFactory,
) -> None:
    url = start_broker().url
    async with aiohttp.ClientSession() as session:
        sizes: list[int] = []
        client = BrokerClient(session, url, 60.0, on_batch=sizes.append)
        bad = LeaseRequest(template="no-such-template", job="b1")
        with pytest.raises(InfraError) as alone:
            await client.lease_one(bad)
        assert client.batcher.batches == 0
        asked = [LeaseRequest(ttl_s=60, job="b1"), bad, LeaseRequest(ttl_s=60, job="b1")]
        got = await asyncio.gather(*(client.lease(r) for r in asked), return_exceptions=True)
        assert client.batcher.batches == 1 and sizes == [3]  # one request for the three
        first, refused, last = got
        assert isinstance(first, Lease) and isinstance(last, Lease) and first.id != last.id
        assert _same_error(refused, alone.value).stage is InfraStage.SANDBOX_CREATE
        assert alone.value.code is ErrorCode.UNKNOWN_TEMPLATE
        assert await _live(session, url, "b1") == {first.id, last.id}
        for lease in (first, last):
            assert (await client.exec(lease.id, ExecRequest(shell="echo hi", timeout_s=30))).stdout == "hi\n"
            await client.release(lease.id)
        assert await _live(session, url, "b1") == set()
        await client.close()


@needs_bwrap
async def test_a_cancelled_caller_never_costs_another_its_lease_and_its_own_is_released(
    start_broker: BrokerFactory,
) -> None:
    url = start_broker().url
    async with aiohttp.ClientSession() as session:
        # cancelled before the batch goes out: its request is left out of it
        client = BrokerClient(session, url, 60.0, batch_window_s=3600.0)  # sent by flush() below
        tasks = [asyncio.create_task(client.lease(LeaseRequest(ttl_s=60, job="c1"))) for _ in range(3)]
        await asyncio.sleep(0)  # each task has run up to its wait
        assert len(client.batcher._gathering) == 3
        tasks[0].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[0]
        client.batcher.flush()
        kept = await asyncio.gather(*tasks[1:])
        assert client.batcher.batches == 1 and await _live(session, url, "c1") == {lease.id for lease in kept}

        # cancelled while the batch is out: the lease made for it is released, the other one kept
        other = BrokerClient(session, url, 60.0)
        tasks = [asyncio.create_task(other.lease(LeaseRequest(ttl_s=60, job="c2"))) for _ in range(2)]
        await asyncio.sleep(0)  # both asked; the end of the loop turn sends them
        await asyncio.sleep(0)
        assert len(other.batcher.sending) == 1
        tasks[0].cancel()
        lease = await tasks[1]
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[0]
        await asyncio.gather(*other.releasing)
        assert other.batcher.batches == 1 and await _live(session, url, "c2") == {lease.id}
        for held in (*kept, lease):
            await client.release(held.id)
        await client.close()
        await other.close()


async def _pool_ready(session: aiohttp.ClientSession, url: str) -> None:
    """Until the broker's warm pool has a sandbox ready (its refill runs in the background)."""
    while True:
        async with session.get(f"{url}/healthz") as answer:
            if sum((await answer.json())["pools"].values()) >= 1:
                return
        await asyncio.sleep(0.05)


@needs_bwrap
@pytest.mark.timeout(120)
async def test_a_warm_lease_never_waits_for_a_miss_of_its_batch(
    start_broker: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = start_broker("--warm-pool", "1").url
    async with aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 60.0)
        cold = LeaseRequest(ttl_s=60, job="w", resources=Resources(cpus=0.5))  # no pool has its resources
        # the route: the hit is leased from the pool, the miss answered warm_miss at once with nothing made
        await _pool_ready(session, url)
        hit, miss = await client.lease_batch([LeaseRequest(ttl_s=60, job="w"), cold], warm_only=True) or []
        assert isinstance(hit, Lease) and hit.warm
        assert isinstance(miss, InfraError) and miss.code is ErrorCode.WARM_MISS and miss.retryable
        assert await _live(session, url, "w") == {hit.id}
        await client.release(hit.id)

        # the coalescer: the hit's caller is answered before the miss is asked again on POST /leases
        asked_again: list[LeaseRequest] = []
        gate = asyncio.Event()
        lease_one = client.lease_one

        async def held_back(request: LeaseRequest) -> Lease:
            asked_again.append(request)
            await gate.wait()
            return await lease_one(request)

        monkeypatch.setattr(client, "lease_one", held_back)
        await _pool_ready(session, url)
        warm_caller = asyncio.create_task(client.lease(LeaseRequest(ttl_s=60, job="w")))
        cold_caller = asyncio.create_task(client.lease(cold))
        warm = await warm_caller  # never answered (the test times out) if it waited for the miss's lease
        assert warm.warm and not cold_caller.done() and asked_again == [cold]
        gate.set()
        made = await cold_caller
        assert not made.warm and client.batcher.batches == 1
        assert await _live(session, url, "w") == {warm.id, made.id}
        async with session.get(f"{url}/metrics") as answer:
            metrics = await answer.text()
        assert "rollout_broker_warm_misses_total 2.0" in metrics  # its own counter, not an error
        assert 'code="warm_miss"' not in metrics
        for lease in (warm, made):
            await client.release(lease.id)
        await client.close()


@needs_bwrap
async def test_a_warm_only_batch_keeps_the_job_quota(start_broker: BrokerFactory) -> None:
    url = start_broker("--warm-pool", "1", env={"ROLLOUT_BROKER_JOB_QUOTA": "1"}).url
    async with aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 60.0)
        held = await client.lease_one(LeaseRequest(ttl_s=60, job="q"))
        await _pool_ready(session, url)
        over = LeaseRequest(ttl_s=60, job="q", wait_s=0)  # over the job's quota of 1
        got = await client.lease_batch([over, over], warm_only=True) or []
        assert [o.code if isinstance(o, InfraError) else o for o in got] == [ErrorCode.WARM_MISS] * 2
        assert await _live(session, url, "q") == {held.id}  # nothing made; the pooled sandbox went back
        # through the coalescer each miss asks POST /leases, which queues for the quota as a lone lease does
        refused = await asyncio.gather(client.lease(over), client.lease(over), return_exceptions=True)
        assert client.batcher.batches == 1
        codes = [error.code if isinstance(error, InfraError) else error for error in refused]
        # as two lone POST /leases at once: the first refused by the quota; the second, queued behind it
        # with wait_s 0, is refused before the queue tried it (admission.py names that capacity)
        assert ErrorCode.QUOTA_EXCEEDED in codes and set(codes) <= {
            ErrorCode.QUOTA_EXCEEDED,
            ErrorCode.CAPACITY_EXHAUSTED,
        }
        assert await _live(session, url, "q") == {held.id}
        async with session.get(f"{url}/healthz") as answer:
            assert sum((await answer.json())["pools"].values()) == 1
        await client.release(held.id)
        await client.close()


class OldBroker:
    """A real HTTP server answering as a broker of the previous version (``POST /leases/batch``:
    405), or with ``batch_status`` for the batch route."""

    def __init__(self, batch_status: int = 405, batch_code: str = "bad_request") -> None:
        self.batch_status, self.batch_code = batch_status, batch_code
        self.singles: list[dict[str, Any]] = []
        self.batches = 0

    async def lease(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.singles.append(body)
        if body.get("template") == "missing":
            error = {"code": "unknown_template", "message": "no template 'missing'", "infra": False}
            return web.json_response({"error": error}, status=400)
        lease = Lease(id=f"lse-{len(self.singles)}", template=body["template"], backend="local", job=body["job"],
                      sandbox_id="s", expires_at=time.time() + 60, warm=True, start_s=0.001)  # fmt: skip
        return web.json_response(lease.model_dump(mode="json"), status=201)

    async def batch(self, _: web.Request) -> web.Response:
        self.batches += 1
        error = {"code": self.batch_code, "message": "", "infra": self.batch_status >= 500}
        return web.json_response({"error": error}, status=self.batch_status)


def _serving(broker: OldBroker) -> contextlib.AbstractAsyncContextManager[str]:
    return serving(web.post("/leases", broker.lease), web.post("/leases/batch", broker.batch))


async def test_a_broker_without_the_batch_route_gets_one_request_per_lease() -> None:
    old = OldBroker()
    async with _serving(old) as url, aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 10.0)
        asked = [LeaseRequest(job="o"), LeaseRequest(template="missing", job="o"), LeaseRequest(job="o")]
        got = await asyncio.gather(*(client.lease(r) for r in asked), return_exceptions=True)
        assert old.batches == 1 and len(old.singles) == 3
        assert [type(g) for g in got] == [Lease, InfraError, Lease]
        with pytest.raises(InfraError) as alone:
            await client.lease_one(asked[1])
        _same_error(got[1], alone.value)
        assert not alone.value.retryable  # a request error: not retried in a fresh sandbox

        # a batch of one, and a lease with a setup, keep POST /leases
        setup = LeaseRequest(job="o", setup=SandboxSetup(key="g", commands=["true"]))
        await asyncio.gather(client.lease(LeaseRequest(job="o")))
        await asyncio.gather(client.lease(setup), client.lease(setup))
        assert old.batches == 1 and len(old.singles) == 7
        await client.close()

    older = OldBroker(batch_status=422, batch_code="validation_error")  # a batch route without warm_only
    async with _serving(older) as url, aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 10.0)
        leases = await asyncio.gather(*(client.lease(LeaseRequest(job="o")) for _ in range(2)))
        assert older.batches == 1 and len(older.singles) == 2 and len({lease.id for lease in leases}) == 2
        await client.close()


async def test_a_failed_batch_fails_each_caller_as_its_own_request_would() -> None:
    busy = OldBroker(batch_status=503, batch_code="backend_unavailable")
    async with _serving(busy) as url, aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 10.0)
        got = await asyncio.gather(*(client.lease(LeaseRequest(job="f")) for _ in range(3)), return_exceptions=True)
        assert busy.batches == 1 and busy.singles == []
        for failed in got:
            assert isinstance(failed, InfraError) and failed.code is ErrorCode.BACKEND_UNAVAILABLE
            assert failed.stage is InfraStage.SANDBOX_CREATE and failed.retryable
        assert len({id(failed) for failed in got}) == 3  # one exception per caller
        await client.close()

    async with aiohttp.ClientSession() as session:  # nothing listening: each caller's transport error
        client = BrokerClient(session, f"http://127.0.0.1:{free_port()}", 10.0)
        got = await asyncio.gather(*(client.lease(LeaseRequest(job="f")) for _ in range(2)), return_exceptions=True)
        with pytest.raises(InfraError) as alone:
            await client.lease_one(LeaseRequest(job="f"))
        for failed in got:
            _same_error(failed, alone.value)
        assert alone.value.code is ErrorCode.TRANSPORT_ERROR
        await client.close()


async def test_claims_that_fail_at_once_leave_the_batch_to_the_broker(redis_url: str) -> None:
    """The claim scripts are written from within a caller's request (or the window's timer): an error
    there must not lose the batch, whose callers would then wait forever."""
    old = OldBroker()
    store = open_redis(redis_url)
    claims = WarmClaims(store)

    def broken(requests: list[LeaseRequest], got: Callable[[int, Lease], None]) -> list[Reply]:
        raise RuntimeError("a claim that fails before any script is written")

    claims.start = broken  # type: ignore[method-assign]
    async with _serving(old) as url, aiohttp.ClientSession() as session:
        client = BrokerClient(session, url, 10.0, claims=claims)
        try:
            got = await asyncio.wait_for(asyncio.gather(*(client.lease(LeaseRequest(job="k")) for _ in range(2))), 30)
            assert old.batches == 1 and len(old.singles) == 2 and len({lease.id for lease in got}) == 2
        finally:
            await client.close()
            await store.aclose(close_connection_pool=True)

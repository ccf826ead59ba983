"""Warm pools (hand-out, refill, cold fallback) and admission control (quotas, capacity, the wait
queue, Retry-After) through a real broker; the fair queue's order in-process."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from services.sandbox_broker.admission import ADMITTED, GLOBAL_FULL, JOB_FULL, Admission, TokenBucket
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap


def _pool_size(client: httpx.Client, target: int, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    size = -1
    while time.monotonic() < deadline:
        size = sum(client.get("/healthz").json()["pools"].values())
        if size >= target:
            return size
        time.sleep(0.05)
    return size


@needs_bwrap
def test_warm_pool_hands_out_then_refills(start_broker: BrokerFactory) -> None:
    broker = start_broker("--warm-pool", "2")
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        assert _pool_size(client, 2) == 2
        first, second = lease(client), lease(client)
        assert first["warm"] and second["warm"]
        assert _pool_size(client, 2) == 2  # refilled in the background
        cold = lease(client, resources={"cpus": 0.5, "memory_mb": 256, "disk_mb": 100})
        assert cold["warm"] is False  # other resources than the pool's: a cold start
        assert client.post(f"/leases/{first['id']}/exec", json={"shell": "true"}).json()["exit_code"] == 0
        registered = client.post("/templates", json={"name": "py", "setup": ["echo ready > setup.txt"], "warm_pool": 1})
        assert registered.status_code == 201
        assert _pool_size(client, 3) == 3
        templated = lease(client, template="py")
        assert templated["warm"] is True
        cat = client.post(f"/leases/{templated['id']}/exec", json={"shell": "cat setup.txt"}).json()
        assert cat["stdout"] == "ready\n"
        metrics = client.get("/metrics").text
        assert 'rollout_broker_pool_hits_total{pool="default/1cpu/2048mb/10240mb/none"} 2.0' in metrics
        assert 'rollout_broker_lease_start_seconds_count{backend="local",kind="cold"} 1.0' in metrics
        for held in (first, second, cold, templated):
            client.delete(f"/leases/{held['id']}")


@needs_bwrap
def test_quotas_capacity_and_the_wait_queue(start_broker: BrokerFactory) -> None:
    broker = start_broker(env={"ROLLOUT_BROKER_JOB_QUOTA": "1", "ROLLOUT_BROKER_MAX_LEASES": "2"})
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        a = lease(client, job="a")
        over_quota = client.post("/leases", json={"job": "a", "wait_s": 0.2})
        assert over_quota.status_code == 429 and over_quota.headers["retry-after"]
        assert over_quota.json()["error"]["code"] == "quota_exceeded" and over_quota.json()["error"]["infra"] is False
        b = lease(client, job="b")
        full = client.post("/leases", json={"job": "c", "wait_s": 0.2})
        assert full.status_code == 503 and full.headers["retry-after"]
        assert full.json()["error"]["code"] == "capacity_exhausted" and full.json()["error"]["infra"] is True

        waited: dict[str, Any] = {}

        def wait_for_capacity() -> None:
            with httpx.Client(base_url=broker.url, timeout=30) as waiter:
                waited["response"] = waiter.post("/leases", json={"job": "c", "wait_s": 20})

        thread = threading.Thread(target=wait_for_capacity)
        thread.start()
        while client.get("/healthz").json()["waiting"] == 0 and thread.is_alive():
            time.sleep(0.02)
        client.delete(f"/leases/{a['id']}")
        thread.join(30)
        assert waited["response"].status_code == 201
        assert 'rollout_broker_errors_total{code="capacity_exhausted"} 1.0' in client.get("/metrics").text
        for held in (b, waited["response"].json()):
            client.delete(f"/leases/{held['id']}")


async def test_the_wait_queue_takes_jobs_in_turn() -> None:
    """Job a queued three requests before job b's one: capacity freed one at a time goes a, b, a, a."""
    admission = Admission()
    free = 0
    order: list[str] = []

    def reserver(name: str) -> Any:
        async def reserve() -> int:
            nonlocal free
            if free == 0:
                return GLOBAL_FULL
            free -= 1
            order.append(name)
            return ADMITTED

        return reserve

    tasks = [asyncio.create_task(admission.admit(job, reserver(f"{job}{i}"), 10)) for job, i in
             (("a", 1), ("a", 2), ("a", 3), ("b", 1))]  # fmt: skip
    await asyncio.sleep(0.01)
    for _ in range(4):
        free += 1
        admission.poke()
        for _ in range(500):  # the queue's poller takes the free slot
            if not free:
                break
            await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert order == ["a1", "b1", "a2", "a3"]

    async def never() -> int:
        return JOB_FULL

    with pytest.raises(Exception, match="quota") as refused:
        await admission.admit("c", never, 0.05)
    assert getattr(refused.value, "status", None) == 429
    await admission.close()


async def test_a_request_behind_waiters_is_served_or_refused_for_what_is_full() -> None:
    """Job a waits at its quota. A request with no time to wait (wait_s 0) is admitted where capacity is
    free (job b), refused 429 for its own job's quota (job a again) and 503 once the capacity is full."""
    admission = Admission()
    free = 2

    async def quota_full() -> int:
        return JOB_FULL

    async def take() -> int:
        nonlocal free
        if free == 0:
            return GLOBAL_FULL
        free -= 1
        return ADMITTED

    waiting = asyncio.create_task(admission.admit("a", quota_full, 10))
    await asyncio.sleep(0.01)
    assert admission.waiting == 1
    await admission.admit("b", take, 0)  # another job's quota holds nobody else
    assert free == 1
    with pytest.raises(Exception, match="quota") as refused:
        await admission.admit("a", quota_full, 0)
    assert getattr(refused.value, "status", None) == 429
    await admission.admit("c", take, 0)
    with pytest.raises(Exception, match="capacity") as refused:
        await admission.admit("d", take, 0)
    assert getattr(refused.value, "status", None) == 503
    assert admission.waiting == 1  # the refused left the queue; job a still waits

    async def store_down() -> int:
        raise ConnectionError("redis is away")

    with pytest.raises(ConnectionError):
        await admission.admit("e", store_down, 5)
    assert admission.waiting == 1  # a request whose try failed is not left in the queue
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.waiting == 0
    await admission.close()


async def test_the_create_rate_limit_spaces_creates_and_refuses_past_the_deadline() -> None:
    bucket = TokenBucket(rate=20, burst=1)
    started = time.monotonic()
    for _ in range(3):
        await bucket.acquire()
    assert time.monotonic() - started >= 0.09  # 2 waits of 1/20 s after the burst of one
    with pytest.raises(Exception, match="rate limit") as refused:
        await bucket.acquire(deadline=time.monotonic())
    assert getattr(refused.value, "code", None) == "rate_limited"

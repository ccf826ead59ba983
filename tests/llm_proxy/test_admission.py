"""The overload queue in-process: first come first served, bounded, refusals with a code and Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from services.llm_proxy.admission import Admission, QueueLimits
from services.llm_proxy.fleet import EngineRuntime
from services.llm_proxy.metrics import ProxyMetrics
from services.protocol import ErrorCode, PlatformError


def _admission(**overrides: float) -> tuple[Admission, list[EngineRuntime]]:
    limits = QueueLimits(**{"slots": 1, "max_calls": 3, "max_bytes": 1000, "wait_s": 30.0, **overrides})  # type: ignore[arg-type]
    engines = [EngineRuntime(url=f"http://e{i}", engine_id=f"e{i}") for i in range(2)]
    return Admission(limits, ProxyMetrics()), engines


def _metric(admission: Admission, name: str, **labels: str) -> float:
    value = admission.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


async def _take(admission: Admission, engines: list[EngineRuntime], pool: str = "p", size: int = 10) -> EngineRuntime:
    """Wait for a free engine and occupy it (what the forwarder does)."""
    free = await admission.engines(pool, lambda: engines, size, None)
    free[0].in_flight += 1
    return free[0]


def _release(admission: Admission, rt: EngineRuntime, pool: str = "p") -> None:
    rt.in_flight -= 1
    admission.released(pool)


async def test_calls_wait_in_order_and_the_bound_refuses_with_retry_after() -> None:
    admission, engines = _admission()
    busy = [await _take(admission, engines) for _ in engines]  # both engines saturated
    order: list[int] = []

    async def queued(n: int) -> EngineRuntime:
        rt = await _take(admission, engines)
        order.append(n)
        return rt

    waiting = [asyncio.create_task(queued(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert admission.waiting == 3 and _metric(admission, "rollout_proxy_queue_depth") == 3
    with pytest.raises(PlatformError) as refused:
        await admission.engines("p", lambda: engines, 10, None)
    assert refused.value.code is ErrorCode.CAPACITY_EXHAUSTED and refused.value.status == 503
    assert refused.value.headers()["Retry-After"] == "2"
    assert _metric(admission, "rollout_proxy_queue_waits_total", outcome="full") == 1
    for rt in busy:
        _release(admission, rt)
    first_two = await asyncio.gather(*waiting[:2])
    assert order == [0, 1] and {rt.engine_id for rt in first_two} == {"e0", "e1"}
    _release(admission, first_two[0])
    await waiting[2]
    assert order == [0, 1, 2] and admission.waiting == 0 and admission.waiting_bytes == 0
    assert _metric(admission, "rollout_proxy_queue_waits_total", outcome="admitted") == 3


async def test_the_byte_bound_refuses_too() -> None:
    admission, engines = _admission(max_bytes=15)
    for _ in engines:
        await _take(admission, engines)
    first = asyncio.create_task(_take(admission, engines, size=10))
    await asyncio.sleep(0)
    with pytest.raises(PlatformError, match="bytes"):
        await admission.engines("p", lambda: engines, 10, None)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert admission.waiting == 0 and _metric(admission, "rollout_proxy_queue_waits_total", outcome="cancelled") == 1


async def test_a_wait_past_its_limit_is_503_and_a_deadline_is_504() -> None:
    admission, engines = _admission(wait_s=0.05)
    for _ in engines:
        await _take(admission, engines)
    with pytest.raises(PlatformError) as waited:
        await admission.engines("p", lambda: engines, 10, None)
    assert waited.value.code is ErrorCode.CAPACITY_EXHAUSTED and waited.value.retry_after_s
    deadline = asyncio.get_running_loop().time() + 0.01
    with pytest.raises(PlatformError) as late:
        await admission.engines("p", lambda: engines, 10, deadline)
    assert late.value.code is ErrorCode.UPSTREAM_TIMEOUT


async def test_a_cancelled_head_passes_its_turn_and_pools_queue_apart() -> None:
    admission, engines = _admission()
    busy = [await _take(admission, engines) for _ in engines]
    head = asyncio.create_task(_take(admission, engines))
    second = asyncio.create_task(_take(admission, engines))
    other_pool = [EngineRuntime(url="http://o", engine_id="o")]
    assert (await _take(admission, other_pool, pool="q")).engine_id == "o"  # another pool does not wait
    await asyncio.sleep(0)
    _release(admission, busy[0])
    head.cancel()
    await asyncio.gather(head, return_exceptions=True)
    assert (await second).engine_id == "e0"


async def test_no_limit_never_queues_and_no_engine_returns_empty() -> None:
    admission, engines = _admission(slots=0)
    for _ in range(10):
        await _take(admission, engines)
    assert admission.waiting == 0
    assert await admission.engines("p", lambda: [], 10, None) == []

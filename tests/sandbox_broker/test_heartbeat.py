"""A broker replica's heartbeat (its ``broker_instance`` key) while its reaper's pass is slow: the key
is what the workers' warm claims and the other replicas' orphan sweeps read as "this replica is
alive", so it must not lapse because one pass (a long orphan sweep on a busy host) takes a while."""

from __future__ import annotations

import asyncio

import redis

from services.protocol import keys
from services.sandbox_broker.reaper import Reaper
from tests.sandbox_broker.recording import InProcessFactory


async def test_the_instance_key_outlives_a_reaper_pass_longer_than_its_ttl(
    make_broker: InProcessFactory, redis_client: redis.Redis
) -> None:
    broker = await make_broker(reap_interval_s=0.2)  # the key lives max(3 x 0.2, 2) = 2 s past a beat
    reaper = Reaper(broker, broker.store.client)
    passes: list[float] = []

    async def slow_pass() -> int:
        passes.append(asyncio.get_running_loop().time())
        await asyncio.sleep(4.0)  # twice the key's TTL
        return 0

    reaper.reap_expired = slow_pass  # type: ignore[method-assign]
    await reaper.start()
    try:
        await asyncio.sleep(3.0)  # within the first slow pass, past the TTL of the beat before it
        assert len(passes) == 1
        assert redis_client.exists(keys.broker_instance(broker.instance)) == 1
        assert 0 < redis_client.pttl(keys.broker_instance(broker.instance)) <= 2000
    finally:
        await reaper.stop()

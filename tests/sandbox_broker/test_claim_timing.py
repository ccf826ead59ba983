"""When a burst's warm claims reach Redis (``worker/warm_claims.py``, ``worker/lease_batches.py``):
a chunk's claim script is written from the request that fills it, before the event loop runs any
other task, so Redis claims the first episodes' sandboxes while the next ones still ask. Offers are
pushed to a real Redis as a broker replica pushes them (``sandbox_broker/offers.py``); no broker
answers, so every lease must come from the claims."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import redis

from services.protocol import keys
from services.protocol.sandboxes import LeaseRequest
from services.protocol.warm_offers import Offer, pool_label
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.warm_claims import CHUNK, WarmClaims
from services.runtime.redis_pool import open_redis

INSTANCE = "replica-t"


def _offer(client: redis.Redis, count: int) -> None:
    label = pool_label("default", LeaseRequest().resources)
    offers = [Offer((10_000, 10_000, 10_000), 5_000, f"sbx-{i}", "local", "default", "/workspace").encode()
              for i in range(count)]  # fmt: skip
    client.lpush(keys.pool_offers(label, INSTANCE), *offers)
    client.sadd(keys.pool_offerers(label), INSTANCE)
    client.set(keys.broker_instance(INSTANCE), "1")


async def test_a_full_chunk_goes_to_redis_before_the_loop_runs_another_task(
    redis_url: str, redis_client: redis.Redis
) -> None:
    _offer(redis_client, 2 * CHUNK)
    store = open_redis(redis_url)
    claims = WarmClaims(store)
    await claims.connect()  # open, as a running worker's is
    assert claims.link is not None
    written: list[Any] = []
    send = claims.link.send

    def recorded(*command: Any) -> asyncio.Future[Any]:
        written.append(command[0])
        return send(*command)

    claims.link.send = recorded  # type: ignore[method-assign]
    async with aiohttp.ClientSession() as session:
        client = BrokerClient(session, "http://127.0.0.1:9", 60.0, batch_window_s=3600.0, claims=claims)
        try:
            first = [asyncio.create_task(client.lease(LeaseRequest(ttl_s=60, job="t1"))) for _ in range(CHUNK)]
            later = asyncio.create_task(client.lease(LeaseRequest(ttl_s=60, job="t1")))
            await asyncio.sleep(0)  # each task has run up to its wait, and nothing since
            assert written == ["EVALSHA"]  # the chunk's script, from the request that filled it
            assert len(client.batcher._gathering) == 1  # the next request waits for its own batch
            leases = await asyncio.gather(*first)
            assert len({lease.sandbox_id for lease in leases}) == CHUNK and all(lease.warm for lease in leases)
            assert client.batcher.batches == 0 and claims.claimed == CHUNK  # no broker request made them
            client.batcher.flush()  # the window's end
            assert (await later).sandbox_id not in {lease.sandbox_id for lease in leases}
            assert redis_client.zcard(keys.leases_index()) == CHUNK + 1
        finally:
            await client.close()
            await store.aclose(close_connection_pool=True)

"""The warm-offer claim script (``protocol/warm_offers.py``) on a real Redis, without a broker: what a
claim writes (each lease's record, the leases index, the job's and each backend's sets) and what it
leaves (the offers it did not take, in their order) when the pool runs out or a limit fills mid-chunk.
The broker-facing behaviour (claimed leases served, quotas as the broker counts them) is in
``tests/sandbox_broker/test_warm_claims.py``."""

from __future__ import annotations

import time
from typing import Any

import orjson

from services.protocol import keys
from services.protocol.sandboxes import Lease, LeaseRequest
from services.protocol.warm_offers import CLAIM, Offer, claim_keys, claim_prefixes, claimed, lease_head, pool_label

REQUEST = LeaseRequest(template="tpl", job="j1", ttl_s=60, labels={"run": "r1"})
LABEL = pool_label(REQUEST.template, REQUEST.resources)
OFFERS = keys.pool_offers(LABEL, "b1")
GRACE_MS = 30_000
# the client is redis-py's sync one, whose replies it types loosely (``Any`` here)


def _offer(index: int, backend: str = "local", job_limit: int = 100) -> str:
    return Offer((100, 100, job_limit), GRACE_MS, f"sbx-{index}", backend, "tpl", "/work").encode()


def _offered(client: Any, texts: list[str]) -> None:
    """A live replica ``b1`` offering ``texts`` as the broker pushes them (``Offers.push``: LPUSH)."""
    client.set(keys.broker_instance("b1"), "1")
    client.sadd(keys.pool_offerers(LABEL), "b1")
    client.lpush(OFFERS, *texts)


def _claim(client: Any, count: int) -> tuple[list[Lease], list[str]]:
    ids = [f"lse-{i:03d}" for i in range(count)]
    expires_at = time.time() + REQUEST.ttl_s
    args: list[str | bytes | float] = [*claim_prefixes(REQUEST)]
    for lease_id in ids:
        args += [lease_id, lease_head(lease_id, REQUEST, expires_at, 0.0), expires_at, int(REQUEST.ttl_s * 1000)]
    found = claim_keys(REQUEST, ids)
    return claimed(client.eval(CLAIM, len(found), *found, *args)), ids


def _members(client: Any, key: str) -> set[str]:
    return {m.decode() for m in client.smembers(key)}


def test_a_claim_records_each_lease_as_the_broker_does(redis_client: Any) -> None:
    _offered(redis_client, [_offer(i) for i in range(3)])
    leases, ids = _claim(redis_client, 2)
    assert [lease.id for lease in leases] == ids
    assert [lease.sandbox_id for lease in leases] == ["sbx-0", "sbx-1"]  # the oldest offers first
    assert all(lease.job == "j1" and lease.labels == {"run": "r1"} and lease.warm for lease in leases)
    index = {m.decode(): score for m, score in redis_client.zrange(keys.leases_index(), 0, -1, withscores=True)}
    assert set(index) == set(ids) and all(abs(index[i] - leases[0].expires_at) < 1 for i in ids)
    assert _members(redis_client, keys.job_leases("j1")) == set(ids)
    assert _members(redis_client, keys.backend_leases("local")) == set(ids)
    for lease in leases:
        record = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.lease(lease.id)).items()}
        assert record["state"] == "live" and record["owner"] == "b1" and record["sandbox_id"] == lease.sandbox_id
        assert Lease.model_validate_json(record["lease"]) == lease
        ttl_ms = redis_client.pttl(keys.lease(lease.id))
        assert REQUEST.ttl_s * 1000 < ttl_ms <= REQUEST.ttl_s * 1000 + GRACE_MS
    assert redis_client.lrange(OFFERS, 0, -1) == [_offer(2).encode()]


def test_a_limit_full_mid_chunk_leaves_every_offer_not_taken_in_its_order(redis_client: Any) -> None:
    texts = [_offer(i, job_limit=2) for i in range(6)]
    _offered(redis_client, texts)
    before = redis_client.lrange(OFFERS, 0, -1)
    leases, _ = _claim(redis_client, 5)
    assert [lease.sandbox_id for lease in leases] == ["sbx-0", "sbx-1"]  # the job's limit of 2
    assert redis_client.lrange(OFFERS, 0, -1) == before[:4]  # the 4 others back, as they were
    assert _members(redis_client, keys.job_leases("j1")) == {lease.id for lease in leases}
    assert redis_client.zcard(keys.leases_index()) == 2
    again, _ = _claim(redis_client, 1)
    assert again == []  # still full: nothing taken, nothing moved
    assert redis_client.lrange(OFFERS, 0, -1) == before[:4]


def test_offers_of_two_backends_count_each_in_its_own_set(redis_client: Any) -> None:
    _offered(redis_client, [_offer(0, "local"), _offer(1, "docker"), _offer(2, "local")])
    leases, _ = _claim(redis_client, 5)  # more asked than offered: the 3 there are
    by_backend = {lease.sandbox_id: lease.id for lease in leases}
    assert set(by_backend) == {"sbx-0", "sbx-1", "sbx-2"}
    assert _members(redis_client, keys.backend_leases("local")) == {by_backend["sbx-0"], by_backend["sbx-2"]}
    assert _members(redis_client, keys.backend_leases("docker")) == {by_backend["sbx-1"]}
    assert redis_client.llen(OFFERS) == 0
    assert orjson.loads(redis_client.hget(keys.lease(by_backend["sbx-1"]), "lease"))["backend"] == "docker"

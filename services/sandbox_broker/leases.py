"""Lease records in Redis: reservation at admission, the record once the sandbox is ready, renewals,
and claims that let exactly one replica tear a lease down (release or reaping).

Keys (all in the ``{leases}`` slot, so the scripts below are legal on a Redis Cluster):
``lease(id)`` hash (fields ``job``, ``backend``, ``owner``, ``state`` and, once live, ``lease`` =
Lease JSON, ``sandbox_id``, ``network``); ``leases_index()`` sorted set id -> deadline (the create
deadline while reserved, the expiry once live); ``job_leases(job)`` and ``backend_leases(b)`` sets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from services.protocol import keys
from services.protocol.sandboxes import Lease
from services.runtime.redis_pipeline import ScriptRun, pipelined, script_runner

# KEYS: index, job set, backend set, record, and for a warm sandbox that is on offer to workers
# (``protocol/warm_offers.py``) its offer list. ARGV: id, deadline, max global, max backend, max job,
# job, backend, owner, record ttl ms, the offer ("" for none), then field/value pairs of a lease that
# goes live at once (a warm sandbox in hand: one round trip). Returns 0 admitted, 1 global full,
# 2 backend full, 3 job full, 4 the offer was gone (a worker claimed the sandbox: nothing written).
_ADMIT = """
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 1 end
if redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[4]) then return 2 end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 3 end
if ARGV[10] ~= '' and redis.call('LREM', KEYS[5], 1, ARGV[10]) == 0 then return 4 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], 'job', ARGV[6], 'backend', ARGV[7], 'owner', ARGV[8], 'state', 'reserved')
for i = 11, #ARGV, 2 do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[4], ARGV[9])
return 0
"""

# KEYS: index, record. ARGV: id, expires_at, record ttl ms, field/value pairs...
# Returns 1, or 0 when the lease was released or claimed by a reaper meanwhile.
_UPDATE = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""

# KEYS: index, then the record of each lease. ARGV: record ttl ms, then per lease its id, expires_at and
# Lease JSON. Renews each lease as ``_UPDATE`` does; returns 1 or 0 per lease, in order.
_RENEW_MANY = """
local renewed = {}
for i = 2, #KEYS do
  local at = (i - 2) * 3 + 2
  if redis.call('ZSCORE', KEYS[1], ARGV[at]) and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('ZADD', KEYS[1], ARGV[at + 1], ARGV[at])
    redis.call('HSET', KEYS[i], 'lease', ARGV[at + 2])
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    renewed[#renewed + 1] = 1
  else
    renewed[#renewed + 1] = 0
  end
end
return renewed
"""
RENEW_CHUNK = 500  # leases per script run: Redis runs nothing else meanwhile (about 5 us a lease)

# KEYS: index, record. ARGV: id, max score ("+inf" for a release), key prefixes of job/backend sets, the
# channel of ended leases. Removes the lease from the index and its sets and announces its end (every
# replica drops its cached record, ``lease_cache.py``); returns 0, or only to the one caller that did,
# "claimed" followed by the record's fields and values (empty if it never went live).
_CLAIM = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
local job = redis.call('HGET', KEYS[2], 'job')
local backend = redis.call('HGET', KEYS[2], 'backend')
if job then redis.call('SREM', ARGV[3] .. job, ARGV[1]) end
if backend then redis.call('SREM', ARGV[4] .. backend, ARGV[1]) end
redis.call('HSET', KEYS[2], 'state', 'closing')
redis.call('PUBLISH', ARGV[5], ARGV[1])
local found = redis.call('HGETALL', KEYS[2])
table.insert(found, 1, 'claimed')
return found
"""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    lease: Lease
    network: str
    owner: str
    state: str = "live"  # "closing" once claimed for release or reaping


class LeaseStore:
    """The broker's view of leases in Redis; every method is one round trip or one script.

    The scripts and reads of the hot paths (lease, exec, renew, release) go over one pipelined
    connection (``runtime.redis_pipeline``) where Redis is one plain TCP server: a burst of leases
    shares it instead of taking a pooled connection each, which would open hundreds of connections
    at once (a connect, ``HELLO``/``AUTH`` and ``CLIENT SETINFO`` each: 23% of the broker's
    samples during such a burst). The rest, and a cluster, use the redis-py client."""

    def __init__(self, client: aioredis.Redis, grace_s: float) -> None:
        self.client = client
        self.grace_s = grace_s
        self.link = pipelined(client)
        self._admit = self._script(_ADMIT)
        self._update = self._script(_UPDATE)
        self._claim = self._script(_CLAIM)
        self._renew_many = self._script(_RENEW_MANY)
        job_prefix = keys.job_leases("")
        backend_prefix = keys.backend_leases("")
        self._prefixes = (job_prefix, backend_prefix, keys.leases_ended())

    def _script(self, source: str) -> ScriptRun:
        return script_runner(self.client, self.link, source)

    async def _hgetall(self, key: str) -> dict[Any, Any]:
        if self.link is None:
            return await self.client.hgetall(key)
        flat = await self.link.execute("HGETALL", key)
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

    async def reserve(
        self, lease_id: str, *, job: str, backend: str, owner: str, deadline: float, limits: tuple[int, int, int]
    ) -> int:
        """Count a lease against the limits before its sandbox exists; 0 when admitted (see ``_ADMIT``)."""
        return await self._reserve(lease_id, job, backend, owner, deadline, limits, {})

    async def reserve_live(self, record: LeaseRecord, limits: tuple[int, int, int],
                           offer: tuple[str, str] | None = None) -> int:  # fmt: skip
        """Admit and store a lease whose sandbox is already in hand, in one round trip; 0 when admitted.
        ``offer`` (list key, offer) is withdrawn from the workers in the same script: 4 where a worker
        claimed it first (nothing written)."""
        lease = record.lease
        return await self._reserve(lease.id, lease.job, lease.backend, record.owner, lease.expires_at, limits,
                                   _live_fields(record), offer)  # fmt: skip

    async def _reserve(self, lease_id: str, job: str, backend: str, owner: str, deadline: float,
                       limits: tuple[int, int, int], fields: dict[str, str],
                       offer: tuple[str, str] | None = None) -> int:  # fmt: skip
        ttl_ms = int((deadline - time.time() + self.grace_s) * 1000)
        flat = [x for pair in fields.items() for x in pair]
        args: list[str | int | float] = [lease_id, deadline, *limits, job, backend, owner, max(ttl_ms, 1000),
                                         offer[1] if offer else "", *flat]  # fmt: skip
        keys_ = [keys.leases_index(), keys.job_leases(job), keys.backend_leases(backend), keys.lease(lease_id)]
        if offer:
            keys_.append(offer[0])
        return int(await self._admit(keys_, args))

    async def activate(self, record: LeaseRecord) -> bool:
        """Store the ready lease; False when it was released or reaped while its sandbox started."""
        return await self._set(record.lease.id, record.lease.expires_at, _live_fields(record))

    async def renew(self, lease: Lease) -> bool:
        return await self._set(lease.id, lease.expires_at, {"lease": lease.model_dump_json()})

    async def renew_many(self, leases: list[Lease]) -> list[bool]:
        """Renew leases that expire at the same time, one script per ``RENEW_CHUNK``; whether each was
        still live (not released or claimed meanwhile)."""
        renewed: list[bool] = []
        for start in range(0, len(leases), RENEW_CHUNK):
            chunk = leases[start : start + RENEW_CHUNK]
            ttl_ms = int((chunk[0].expires_at - time.time() + self.grace_s) * 1000)
            args: list[str | int | float] = [max(ttl_ms, 1000)]
            for lease in chunk:
                args += [lease.id, lease.expires_at, lease.model_dump_json()]
            keys_ = [keys.leases_index(), *(keys.lease(lease.id) for lease in chunk)]
            renewed += [bool(int(x)) for x in await self._renew_many(keys_, args)]
        return renewed

    async def _set(self, lease_id: str, expires_at: float, fields: dict[str, str]) -> bool:
        ttl_ms = int((expires_at - time.time() + self.grace_s) * 1000)
        flat = [x for pair in fields.items() for x in pair]
        args: list[str | int | float] = [lease_id, expires_at, max(ttl_ms, 1000), *flat]
        return bool(await self._update([keys.leases_index(), keys.lease(lease_id)], args))

    async def get(self, lease_id: str) -> LeaseRecord | None:
        return _record(await self._hgetall(keys.lease(lease_id)))

    async def get_many(self, lease_ids: list[str]) -> list[LeaseRecord | None]:
        """:meth:`get` of each, in one pipeline."""
        if not lease_ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for lease_id in lease_ids:
                pipe.hgetall(keys.lease(lease_id))
            found = await pipe.execute()
        return [_record(raw) for raw in found]

    async def state(self, lease_id: str) -> str | None:
        raw = await self.client.hget(keys.lease(lease_id), "state")
        return _text(raw) if raw is not None else None

    async def claim(self, lease_id: str, max_score: float | str = "+inf") -> LeaseRecord | bool | None:
        """Take the lease out of the index. False: someone else did; else its record (None if it never went live)."""
        raw = await self._claim([keys.leases_index(), keys.lease(lease_id)], [lease_id, max_score, *self._prefixes])
        if not isinstance(raw, list):
            return False
        return _record(dict(zip(raw[1::2], raw[2::2], strict=True)))  # the record, read in the same script

    async def forget(self, lease_id: str) -> None:
        if self.link is None:
            await self.client.delete(keys.lease(lease_id))
        else:
            await self.link.execute("DEL", keys.lease(lease_id))

    async def expired(self, now: float, limit: int = 200) -> list[str]:
        ids = await self.client.zrangebyscore(keys.leases_index(), "-inf", now, start=0, num=limit)
        return [_text(i) for i in ids]

    async def live_sandbox_ids(self) -> set[str]:
        ids = await self.client.zrange(keys.leases_index(), 0, -1)
        if not ids:
            return set()
        async with self.client.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(keys.lease(_text(i)), "sandbox_id")
            found = await pipe.execute()
        return {_text(s) for s in found if s}

    async def exists(self, lease_id: str) -> bool:
        return bool(await self.client.exists(keys.lease(lease_id)))

    async def list(self, job: str | None) -> list[Lease]:
        ids: list[Any]
        if job is not None:
            ids = list(await self.client.smembers(keys.job_leases(job)))
        else:
            ids = list(await self.client.zrange(keys.leases_index(), 0, -1))
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(keys.lease(_text(i)), "lease")
            found = await pipe.execute()
        leases = [Lease.model_validate_json(raw) for raw in found if raw]
        return sorted(leases, key=lambda lease: lease.id)

    async def count(self) -> int:
        return int(await self.client.zcard(keys.leases_index()))

    async def job_counts(self) -> dict[str, int]:
        prefix = keys.job_leases("")
        counts: dict[str, int] = {}
        async for key in self.client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*"):
            counts[_text(key)[len(prefix) :]] = int(await self.client.scard(key))
        return counts


def _live_fields(record: LeaseRecord) -> dict[str, str]:
    lease = record.lease
    return {"lease": lease.model_dump_json(), "sandbox_id": lease.sandbox_id, "network": record.network,
            "state": "live"}  # fmt: skip


def _record(raw: dict[Any, Any]) -> LeaseRecord | None:
    if not raw or b"lease" not in raw:
        return None
    return LeaseRecord(
        lease=Lease.model_validate_json(raw[b"lease"]),
        network=raw.get(b"network", b"none").decode(),
        owner=raw.get(b"owner", b"").decode(),
        state=raw.get(b"state", b"live").decode(),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

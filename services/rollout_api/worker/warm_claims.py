"""Warm sandboxes claimed straight from Redis: a lease with no broker request
(``protocol/warm_offers.py``).

The lease coalescer (``lease_batches.py``) first asks here for the requests of a batch that a warm
sandbox can serve (no setup, no network, the template's isolation): one script call per
``CHUNK`` requests of the same pool and job, each chunk's callers answered as soon as its call
returns, so the first episodes of a burst need not wait for the last ones' leases. What is not
claimed (no offer left, a limit full, Redis away) goes on to the broker as before. A claimed
lease is the broker's like any other: exec, renew, release and reaping go through it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from itertools import groupby

import redis
import redis.asyncio as aioredis

from services.protocol.sandboxes import Lease, LeaseRequest
from services.protocol.warm_offers import CLAIM, claim_keys, claim_prefixes, claimable, claimed, lease_head
from services.runtime.redis_pipeline import pipelined, script_runner

log = logging.getLogger(__name__)
Reply = asyncio.Future[list[Lease]]  # a chunk's leases
CHUNK = 64  # leases per script call: Redis runs nothing else meanwhile (about 10 us a lease)
RETRY_S = 5.0  # after Redis failed a claim, the broker alone serves leases this long


class WarmClaims:
    def __init__(self, client: aioredis.Redis, on_claims: Callable[[int, int], None] | None = None) -> None:
        self.link = pipelined(client)
        self._run = script_runner(client, self.link, CLAIM)
        self.on_claims = on_claims  # told (claimed, asked) after each script call (metrics)
        self.claimed = 0
        self._resting_until = 0.0

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

    async def connect(self) -> None:
        """Open the pipelined connection now (a long-running worker's is open when a burst comes)."""
        if self.link is not None:
            await self.link.connect()

    def start(self, requests: list[LeaseRequest], got: Callable[[int, Lease], None]) -> list[Reply]:
        """Claim warm sandboxes for those of ``requests`` one can serve; ``got(i, lease)`` for each
        request ``i`` that has its lease, as soon as its chunk is claimed (the rest are not told).

        Every chunk's script is written before this returns (over the pipelined connection): Redis
        runs the first chunks while the caller's event loop still runs the next episodes' requests,
        not once the loop comes back to a task. The futures (one per chunk, its leases) may be
        awaited or not: the leases reach ``got`` either way. A chunk that finds the pool empty or a
        limit full claims nothing."""
        if time.monotonic() < self._resting_until:
            return []
        wanted = sorted((i for i, r in enumerate(requests) if claimable(r)), key=lambda i: _pool(requests[i]))
        sent = []
        for _, group in groupby(wanted, key=lambda i: _pool(requests[i])):
            indices = list(group)
            for start in range(0, len(indices), CHUNK):
                chunk = indices[start : start + CHUNK]
                reply = self._send([requests[i] for i in chunk])
                reply.add_done_callback(functools.partial(_hand_over, chunk, got))
                sent.append(reply)
        return sent

    async def claim(self, requests: list[LeaseRequest], got: Callable[[int, Lease], None]) -> None:
        """:meth:`start`, then wait for every chunk (cancelled meanwhile: the leases still reach ``got``)."""
        for reply in self.start(requests, got):
            await asyncio.shield(reply)

    def _send(self, chunk: list[LeaseRequest]) -> Reply:
        first = chunk[0]
        now, started = time.time(), time.monotonic()
        ids = ["lse-" + secrets.token_hex(12) for _ in chunk]
        args: list[str | bytes | float] = [*claim_prefixes(first)]
        for lease_id, request in zip(ids, chunk, strict=True):
            expires_at = now + request.ttl_s
            args += [lease_id, lease_head(lease_id, request, expires_at, 0.0), expires_at, int(request.ttl_s * 1000)]
        return asyncio.ensure_future(self._receive(self._run(claim_keys(first, ids), args), len(chunk), started))

    async def _receive(self, reply: Awaitable[list[bytes]], asked: int, started: float) -> list[Lease]:
        try:
            docs = await reply
        except redis.RedisError as exc:
            if time.monotonic() >= self._resting_until:
                log.warning("claiming warm sandboxes from Redis failed (%s); the broker serves leases alone for "
                            "%.0fs", exc, RETRY_S)  # fmt: skip
            self._resting_until = time.monotonic() + RETRY_S
            return []
        leases = claimed(docs)
        spent = time.monotonic() - started
        for lease in leases:
            lease.start_s = spent
        self.claimed += len(leases)
        if self.on_claims is not None:
            self.on_claims(len(leases), asked)
        return leases


def _hand_over(chunk: list[int], got: Callable[[int, Lease], None], reply: Reply) -> None:
    if not reply.cancelled() and reply.exception() is None:
        for i, lease in zip(chunk, reply.result(), strict=False):
            got(i, lease)


def _pool(request: LeaseRequest) -> tuple[str, float, int, int, str]:
    return request.template, request.resources.cpus, request.resources.memory_mb, request.resources.disk_mb, request.job

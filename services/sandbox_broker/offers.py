"""This replica's warm sandboxes on offer to workers, who claim them straight from Redis
(``protocol/warm_offers.py``): the offers pushed as the pools fill, withdrawn before the broker
uses or destroys a sandbox itself, and read back to see which ones workers claimed."""

from __future__ import annotations

from typing import Any

from services.protocol import keys
from services.protocol.warm_offers import Offer
from services.sandbox_broker.backends.base import Sandbox
from services.sandbox_broker.leases import LeaseStore

LIST_TTL_MS = 600_000  # an offer list outlives its replica by this long (refreshed while it lives)
WAITING_TTL_MS = 2_000  # the waiting flag outlives the last tick that saw the queue non-empty


class Offers:
    def __init__(self, store: LeaseStore, instance: str, limits: tuple[int, int, int], backend: str) -> None:
        self.client = store.client
        self.link = store.link
        self.instance = instance
        self.limits = limits
        self.grace_ms = int(store.grace_s * 1000)
        self.backend = backend
        self._waiting = False

    def describe(self, template: str, sandbox: Sandbox) -> Offer:
        """A pooled sandbox of ``template`` as workers may claim it."""
        return Offer(self.limits, self.grace_ms, sandbox.sandbox_id, self.backend, template, sandbox.workdir)

    async def _run(self, *command: Any) -> Any:
        if self.link is not None:
            return await self.link.execute(*command)
        return await self.client.execute_command(*command)  # type: ignore[no-untyped-call]

    def list_key(self, label: str) -> str:
        return keys.pool_offers(label, self.instance)

    async def reset(self) -> None:
        """Drop every list an earlier run of this replica offered (its sandboxes are gone, or orphans
        the reaper's start-up sweep destroys), whether or not this run keeps the same pools."""
        registry = keys.offer_lists(self.instance)
        for label in await self._run("SMEMBERS", registry):
            await self._run("DEL", self.list_key(label.decode() if isinstance(label, bytes) else label))
        await self._run("DEL", registry)

    async def push(self, label: str, texts: list[str]) -> None:
        """Offer the sandboxes by their texts (``Offer.encode``; each withdrawn by its text)."""
        key = self.list_key(label)
        await self._run("SADD", keys.offer_lists(self.instance), label)
        await self._run("LPUSH", key, *texts)
        await self._run("SADD", keys.pool_offerers(label), self.instance)
        await self._run("PEXPIRE", key, LIST_TTL_MS)

    async def withdraw(self, label: str, text: str) -> bool:
        """Take an offer back; False where a worker claimed it first (the sandbox is its lease's now)."""
        return bool(await self._run("LREM", self.list_key(label), 1, text))

    async def length(self, label: str) -> int:
        return int(await self._run("LLEN", self.list_key(label)))

    async def still_offered(self, label: str) -> set[str]:
        """The texts of the offers no worker has claimed."""
        found = await self._run("LRANGE", self.list_key(label), 0, -1)
        return {item.decode() if isinstance(item, bytes) else item for item in found}

    async def keep(self, label: str) -> None:
        """This replica still offers the pool (the set may have dropped it while its key was away)."""
        await self._run("SADD", keys.pool_offerers(label), self.instance)
        await self._run("PEXPIRE", self.list_key(label), LIST_TTL_MS)

    async def waiting(self, queued: bool) -> None:
        """Tell claimers whether lease requests wait in this replica's admission queue."""
        if queued:
            await self._run("SET", keys.broker_waiting(self.instance), "1", "PX", WAITING_TTL_MS)
        elif self._waiting:
            await self._run("DEL", keys.broker_waiting(self.instance))
        self._waiting = queued

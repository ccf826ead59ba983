"""Fleet membership shared by every proxy process: engines, pools and pool state, in one Redis hash.

Fields of ``keys.proxy_state()``: ``engine:<url>`` -> :class:`EngineRecord` JSON,
``pool:<name>`` -> :class:`PoolRecord` JSON, ``held:<pool>`` -> calls held during the current
update. Every change is followed by a message on ``keys.proxy_events()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel
from redis.asyncio import Redis

from services.protocol import keys

EngineState = Literal["active", "draining", "quarantined"]


def engine_id_of(url: str) -> str:
    """The engine's id in provenance and metrics: ``host:port`` of its URL."""
    return urlsplit(url).netloc or url


class EngineRecord(BaseModel):
    url: str
    pool: str
    state: EngineState = "active"
    reason: str | None = None  # why it is quarantined
    stage_url: str | None = None  # its host's /rollout/stage_weights (weight store fetch + checksum)

    @property
    def engine_id(self) -> str:
        return engine_id_of(self.url)


class PoolRecord(BaseModel):
    name: str
    version: str | None = None  # the weight version every engine of the pool serves
    location: str | None = None  # where that version's weights are
    checksum: str | None = None  # of that export (engines joining later verify it too)
    updating: bool = False  # a weight update is running: hold new calls
    hold_timeout_s: float = 300.0
    adapters: dict[str, str] = {}  # LoRA adapters loaded on every engine of the pool: name -> path


@dataclass
class Fleet:
    """A snapshot of the shared state."""

    engines: dict[str, EngineRecord] = field(default_factory=dict)
    pools: dict[str, PoolRecord] = field(default_factory=dict)

    def pool_engines(self, pool: str) -> list[EngineRecord]:
        return [e for e in self.engines.values() if e.pool == pool]


class MembershipStore:
    """Reads and writes the shared hash; every write publishes a change notice."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.key = keys.proxy_state()
        self.channel = keys.proxy_events()

    async def read(self) -> Fleet:
        raw = await self.redis.hgetall(self.key)
        fleet = Fleet()
        for name, value in raw.items():
            kind, _, ident = _text(name).partition(":")
            if kind == "engine":
                fleet.engines[ident] = EngineRecord.model_validate_json(value)
            elif kind == "pool":
                fleet.pools[ident] = PoolRecord.model_validate_json(value)
        for rec in fleet.engines.values():
            fleet.pools.setdefault(rec.pool, PoolRecord(name=rec.pool))
        return fleet

    async def seed(self, pools: dict[str, list[str]]) -> None:
        """Add configured engines and pools that are not known yet (a restart keeps runtime changes)."""
        for pool, urls in pools.items():
            await self.redis.hsetnx(self.key, f"pool:{pool}", PoolRecord(name=pool).model_dump_json())
            for url in urls:
                await self.redis.hsetnx(self.key, f"engine:{url}", EngineRecord(url=url, pool=pool).model_dump_json())
        await self.notify()

    async def put_engine(self, record: EngineRecord) -> None:
        await self.redis.hset(self.key, f"engine:{record.url}", record.model_dump_json())
        await self.notify()

    async def remove_engine(self, url: str) -> bool:
        removed = int(await self.redis.hdel(self.key, f"engine:{url}"))
        await self.notify()
        return removed > 0

    async def put_pool(self, record: PoolRecord) -> None:
        await self.redis.hset(self.key, f"pool:{record.name}", record.model_dump_json())
        await self.notify()

    async def count_held(self, pool: str) -> None:
        await self.redis.hincrby(self.key, f"held:{pool}", 1)

    async def reset_held(self, pool: str) -> int:
        """Zero the held-calls counter of ``pool``; returns what it was."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(self.key, f"held:{pool}")
            pipe.hset(self.key, f"held:{pool}", 0)
            old, _ = await pipe.execute()
        return int(old or 0)

    async def notify(self) -> None:
        await self.redis.publish(self.channel, b"changed")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

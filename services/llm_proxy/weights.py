"""The weight-update transaction of one pool, run by whichever proxy process receives it.

Lock the pool (one transaction at a time across all processes), hold new calls at every proxy
process, pause every engine (``retract`` by default, so no KV from the old weights survives),
load the new weights on all of them in parallel, verify each reports the new version, flush
caches, continue generation, release the held calls. An engine that fails a step is quarantined
and reported; the others proceed. If every engine fails, none is quarantined and the pool keeps
its old version (the engines still serve the old weights).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from services.llm_proxy.membership import EngineRecord, MembershipStore
from services.llm_proxy.staging import StageFailed, stage
from services.llm_proxy.upstream import EngineClient
from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.weights import EngineUpdateResult, WeightUpdate, WeightUpdateResult

log = logging.getLogger(__name__)

RELEASE_LOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


@dataclass
class _Step:
    """One engine's progress through the transaction."""

    record: EngineRecord
    result: EngineUpdateResult
    path: str | None = None  # where its host staged the export

    @property
    def alive(self) -> bool:
        return self.result.error is None


class WeightTransaction:
    def __init__(
        self, redis: Redis, store: MembershipStore, client: EngineClient, lock_ttl_s: float, settle_s: float
    ) -> None:
        self.settle_s = settle_s
        self.redis = redis
        self.store = store
        self.client = client
        self.lock_ttl_s = lock_ttl_s

    async def run(self, update: WeightUpdate) -> WeightUpdateResult:
        lock = keys.proxy_weight_lock(update.pool)
        token = uuid.uuid4().hex
        if not await self.redis.set(lock, token, nx=True, px=int(self.lock_ttl_s * 1000)):
            raise PlatformError(ErrorCode.CONFLICT, f"a weight update of pool {update.pool} is already running")
        try:
            return await self._locked(update)
        finally:
            await self.redis.eval(RELEASE_LOCK, 1, lock, token)

    async def _locked(self, update: WeightUpdate) -> WeightUpdateResult:
        started = time.monotonic()
        fleet = await self.store.read()
        pool = fleet.pools.get(update.pool)
        if pool is None:
            raise PlatformError(ErrorCode.UNKNOWN_POOL, f"no pool named {update.pool!r}")
        steps = [
            _Step(rec, EngineUpdateResult(engine_id=rec.engine_id, ok=False))
            for rec in fleet.pool_engines(update.pool)
            if rec.state == "active"
        ]
        # fetch and verify on every engine host first, while the engines still serve the old weights
        await self._phase(steps, "stage_s", lambda s: self._stage(s, update))
        await self.store.reset_held(update.pool)
        await self.store.put_pool(pool.model_copy(update={"updating": True, "hold_timeout_s": update.hold_timeout_s}))
        held_from = time.monotonic()
        # let every process see the flag before engines pause; a call that still slips through
        # waits in the paused engine's queue (retract, in_place) and finishes after the update
        await asyncio.sleep(self.settle_s)
        log.info("weight update of pool %s to %s on %d engines", update.pool, update.version, len(steps))
        try:
            await self._phase(steps, "pause_s", lambda s: self._pause(s, update))
            await self._phase(steps, "update_s", lambda s: self._load(s, update))
            await self._phase(steps, "verify_s", lambda s: self._verify(s, update))
            await asyncio.gather(*(self._flush(s) for s in steps if s.alive))
        finally:
            await asyncio.gather(*(self._continue(s) for s in steps))
            succeeded = [s for s in steps if s.alive]
            quarantined = await self._settle(steps, succeeded)
            new = {"version": update.version, "location": update.location, "checksum": update.checksum}
            await self.store.put_pool(pool.model_copy(update={"updating": False, **(new if succeeded else {})}))
        held_s = time.monotonic() - held_from
        for s in steps:
            s.result.ok = s.alive
        held_calls = await self.store.reset_held(update.pool)
        return WeightUpdateResult(
            pool=update.pool,
            version=update.version,
            ok=bool(steps) and all(s.alive for s in steps),
            engines=[s.result for s in steps],
            quarantined=quarantined,
            held_calls=held_calls,
            held_s=held_s,
            total_s=time.monotonic() - started,
        )

    async def _phase(self, steps: list[_Step], timing: str, act: Callable[[_Step], Awaitable[None]]) -> None:
        async def timed(step: _Step) -> None:
            t0 = time.monotonic()
            await act(step)
            setattr(step.result, timing, time.monotonic() - t0)

        await asyncio.gather(*(timed(s) for s in steps if s.alive))

    async def _stage(self, step: _Step, update: WeightUpdate) -> None:
        try:
            step.path = await stage(self.client, step.record, update.location, update.checksum)
        except StageFailed as exc:
            step.result.error = str(exc)

    async def _pause(self, step: _Step, update: WeightUpdate) -> None:
        status, doc = await self.client.call("POST", step.record.url + "/pause_generation", {"mode": update.pause_mode})
        if status != 200:
            step.result.error = f"pause_generation: {status} {doc}"

    async def _load(self, step: _Step, update: WeightUpdate) -> None:
        body = {"model_path": step.path or update.location, "weight_version": update.version, "flush_cache": True,
                "abort_all_requests": False}  # fmt: skip
        status, doc = await self.client.call("POST", step.record.url + "/update_weights_from_disk", body)
        if status != 200 or not (isinstance(doc, dict) and doc.get("success")):
            step.result.error = f"update_weights_from_disk: {status} {doc}"

    async def _verify(self, step: _Step, update: WeightUpdate) -> None:
        status, doc = await self.client.call("GET", step.record.url + "/get_model_info")
        version = doc.get("weight_version") if isinstance(doc, dict) else None
        step.result.version = None if version is None else str(version)
        if status != 200 or version != update.version:
            step.result.error = f"get_model_info: {status}, weight_version {version!r} != {update.version!r}"

    async def _flush(self, step: _Step) -> None:
        """Best effort: SGLang refuses while requests wait (retracted ones do); the load flushed already."""
        status, doc = await self.client.call("POST", step.record.url + "/flush_cache")
        if status not in (200, 400):
            log.warning("flush_cache on %s: %s %s", step.record.engine_id, status, doc)

    async def _continue(self, step: _Step) -> None:
        status, doc = await self.client.call("POST", step.record.url + "/continue_generation", {})
        if status != 200:
            log.warning("continue_generation on %s: %s %s", step.record.engine_id, status, doc)
            if step.alive:
                step.result.error = f"continue_generation: {status} {doc}"

    async def _settle(self, steps: list[_Step], succeeded: list[_Step]) -> list[str]:
        """Quarantine the engines that failed, unless all did (then the pool stays as it was)."""
        failed = [s for s in steps if not s.alive]
        if not succeeded:
            return []
        for s in failed:
            log.warning("engine %s quarantined: %s", s.record.engine_id, s.result.error)
            await self.store.put_engine(s.record.model_copy(update={"state": "quarantined", "reason": s.result.error}))
        return [s.record.engine_id for s in failed]

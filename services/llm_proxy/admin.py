"""The admin API: membership changes seen by every process, weight updates, status."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.llm_proxy.adapters import AdapterChange, Adapters
from services.llm_proxy.fleet import FleetView
from services.llm_proxy.membership import EngineRecord, MembershipStore, PoolRecord
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.responses import error_response, json_response, read_json
from services.llm_proxy.staging import StageFailed, stage
from services.llm_proxy.upstream import EngineClient
from services.llm_proxy.weights import WeightTransaction
from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.fields import Name
from services.protocol.weights import WeightUpdate

log = logging.getLogger(__name__)


class EngineJoin(BaseModel):
    """``POST /admin/engines`` (add, or re-admit a quarantined engine) and ``/admin/engines/move``."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^https?://")
    pool: Name
    stage_url: str | None = Field(None, pattern=r"^https?://")  # the host's weight-staging route
    drain_timeout_s: float = Field(60.0, gt=0)  # move: how long to wait for the engine to go idle


class EngineRef(BaseModel):
    """``POST /admin/engines/drain`` and ``/admin/engines/remove``."""

    model_config = ConfigDict(extra="forbid")

    url: str


class Admin:
    def __init__(
        self,
        view: FleetView,
        store: MembershipStore,
        client: EngineClient,
        transaction: WeightTransaction,
        metrics: ProxyMetrics,
    ) -> None:
        self.metrics = metrics
        self.adapters = Adapters(store, client)
        self.view = view
        self.store = store
        self.client = client
        self.transaction = transaction

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/status", self.status)
        app.router.add_post("/admin/engines", self._wrap(self.join))
        app.router.add_post("/admin/engines/move", self._wrap(self.move))
        app.router.add_post("/admin/engines/drain", self._wrap(self.drain))
        app.router.add_post("/admin/engines/remove", self._wrap(self.remove))
        app.router.add_post("/admin/weights", self._wrap(self.weights))
        app.router.add_post("/admin/lora", self._wrap(self.lora))

    @staticmethod
    def _wrap(handler: Any) -> Any:
        async def wrapped(request: web.Request) -> web.Response:
            try:
                return await handler(await read_json(request))  # type: ignore[no-any-return]
            except ValidationError as exc:
                return error_response(PlatformError(ErrorCode.VALIDATION_ERROR, str(exc)))
            except PlatformError as exc:
                return error_response(exc)

        return wrapped

    async def status(self, request: web.Request) -> web.Response:
        await self.view.refresh()
        pools: dict[str, Any] = {}
        for name, pool in self.view.fleet.pools.items():
            engines = []
            for rec in self.view.fleet.pool_engines(name):
                rt = self.view.runtime.get(rec.url)
                engines.append({**rec.model_dump(), "engine_id": rec.engine_id,
                                "ejected": bool(rt and rt.ejected), "in_flight": rt.in_flight if rt else 0,
                                "load": rt.load if rt else 0,
                                "weight_version": rt.weight_version if rt else None})  # fmt: skip
            pools[name] = {**pool.model_dump(), "engines": engines}
        # the store's generation: an engine that joined in another one rejoins (engines/registration.py)
        generation: Any = await self.store.redis.get(keys.store_generation())
        return json_response({"pools": pools, "store_generation": _text_or_none(generation)})

    async def join(self, body: dict[str, Any]) -> web.Response:
        req = EngineJoin.model_validate(body)
        pool = await self._pool(req.pool, create=True)
        record = EngineRecord(url=req.url.rstrip("/"), pool=req.pool, stage_url=req.stage_url)
        await self._load_pool_weights(record, pool)
        await self.adapters.load_all(record.url, pool)
        await self.store.put_engine(record)
        log.info("engine %s joined pool %s", req.url, req.pool)
        return json_response({"url": req.url, "pool": req.pool, "state": "active"})

    async def move(self, body: dict[str, Any]) -> web.Response:
        """Drain, wait until idle, load the target pool's weights, join the target pool."""
        req = EngineJoin.model_validate(body)
        record = await self._record(req.url)
        target = await self._pool(req.pool, create=True)
        await self.store.put_engine(record.model_copy(update={"state": "draining"}))
        await self._wait_idle(record.url, req.drain_timeout_s)
        moved = EngineRecord(url=record.url, pool=req.pool, stage_url=req.stage_url or record.stage_url)
        await self._load_pool_weights(moved, target)
        await self.adapters.load_all(record.url, target)
        await self.store.put_engine(moved)
        log.info("engine %s moved from pool %s to %s", record.url, record.pool, req.pool)
        return json_response({"url": record.url, "pool": req.pool, "state": "active"})

    async def drain(self, body: dict[str, Any]) -> web.Response:
        record = await self._record(EngineRef.model_validate(body).url)
        await self.store.put_engine(record.model_copy(update={"state": "draining"}))
        return json_response({"url": record.url, "pool": record.pool, "state": "draining"})

    async def remove(self, body: dict[str, Any]) -> web.Response:
        url = EngineRef.model_validate(body).url.rstrip("/")
        if not await self.store.remove_engine(url):
            raise PlatformError(ErrorCode.NOT_FOUND, f"no engine {url}")
        return json_response({"url": url, "removed": True})

    async def weights(self, body: dict[str, Any]) -> web.Response:
        result = await self.transaction.run(WeightUpdate.model_validate(body))
        self.metrics.weight_update.labels(result.pool).observe(result.total_s)
        return json_response(result.model_dump(mode="json"))

    async def lora(self, body: dict[str, Any]) -> web.Response:
        return json_response(await self.adapters.change(AdapterChange.model_validate(body)))

    # -- helpers ------------------------------------------------------------------------

    async def _record(self, url: str) -> EngineRecord:
        fleet = await self.store.read()
        record = fleet.engines.get(url.rstrip("/"))
        if record is None:
            raise PlatformError(ErrorCode.NOT_FOUND, f"no engine {url}")
        return record

    async def _pool(self, name: str, *, create: bool) -> PoolRecord:
        fleet = await self.store.read()
        pool = fleet.pools.get(name)
        if pool is None:
            if not create:
                raise PlatformError(ErrorCode.UNKNOWN_POOL, f"no pool named {name!r}")
            pool = PoolRecord(name=name)
            await self.store.put_pool(pool)
        if pool.updating:
            raise PlatformError(ErrorCode.CONFLICT, f"pool {name} is updating its weights; try again")
        return pool

    async def _load_pool_weights(self, record: EngineRecord, pool: PoolRecord) -> None:
        """Bring the engine to the pool's current weights before it takes calls."""
        if pool.version is None or pool.location is None:
            return
        base = record.url
        status, info = await self.client.call("GET", base + "/get_model_info")
        if status == 200 and isinstance(info, dict) and info.get("weight_version") == pool.version:
            return
        try:
            path = await stage(self.client, record, pool.location, pool.checksum)
        except StageFailed as exc:
            raise PlatformError(
                ErrorCode.WEIGHT_UPDATE_FAILED, f"{base} could not stage {pool.location}: {exc}"
            ) from exc
        body = {"model_path": path, "weight_version": pool.version, "flush_cache": True}
        status, doc = await self.client.call("POST", base + "/update_weights_from_disk", body)
        if status != 200 or not (isinstance(doc, dict) and doc.get("success")):
            raise PlatformError(ErrorCode.WEIGHT_UPDATE_FAILED, f"{base} could not load {pool.location}: {doc}")

    async def _wait_idle(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, load = await self.client.call("GET", url.rstrip("/") + "/get_load")
            entries = load if isinstance(load, list) else [load]
            if status == 200 and sum(int(e.get("num_reqs", 0)) for e in entries if isinstance(e, dict)) == 0:
                return
            await asyncio.sleep(0.2)
        raise PlatformError(ErrorCode.CONFLICT, f"{url} did not drain within {timeout_s} s")


def _text_or_none(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)

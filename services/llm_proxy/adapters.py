"""LoRA adapters per pool: jobs that share a base model share a pool and each loads its adapter.

``POST /admin/lora`` fans ``/load_lora_adapter`` or ``/unload_lora_adapter`` out to every active
engine of the pool and records the pool's adapters, so an engine that joins later loads them too.
Calls name their adapter with SGLang's own ``lora_path`` field, which the proxy passes through.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from services.llm_proxy.membership import MembershipStore, PoolRecord
from services.llm_proxy.upstream import EngineClient
from services.protocol import ErrorCode, PlatformError
from services.protocol.fields import Name

log = logging.getLogger(__name__)


class AdapterChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pool: Name
    action: Literal["load", "unload"]
    lora_name: str
    lora_path: str | None = None  # required to load


class Adapters:
    def __init__(self, store: MembershipStore, client: EngineClient) -> None:
        self.store = store
        self.client = client

    async def change(self, req: AdapterChange) -> dict[str, Any]:
        """Fan the change out; the pool's record follows the engines that succeeded."""
        if req.action == "load" and not req.lora_path:
            raise PlatformError(ErrorCode.VALIDATION_ERROR, "lora_path is required to load an adapter")
        fleet = await self.store.read()
        pool = fleet.pools.get(req.pool)
        if pool is None:
            raise PlatformError(ErrorCode.UNKNOWN_POOL, f"no pool named {req.pool!r}")
        urls = [e.url for e in fleet.pool_engines(req.pool) if e.state == "active"]
        results = await asyncio.gather(*(self._apply(url, req) for url in urls))
        adapters = dict(pool.adapters)
        if req.action == "load":
            adapters[req.lora_name] = str(req.lora_path)
        else:
            adapters.pop(req.lora_name, None)
        await self.store.put_pool(pool.model_copy(update={"adapters": adapters}))
        return {"pool": req.pool, "adapters": adapters, "engines": results, "ok": all(r["ok"] for r in results)}

    async def _apply(self, url: str, req: AdapterChange) -> dict[str, Any]:
        body: dict[str, Any] = {"lora_name": req.lora_name}
        if req.action == "load":
            body["lora_path"] = req.lora_path
        status, doc = await self.client.call("POST", f"{url}/{req.action}_lora_adapter", body)
        ok = status == 200 and isinstance(doc, dict) and bool(doc.get("success"))
        if not ok:
            log.warning("%s of LoRA %s on %s failed: %s %s", req.action, req.lora_name, url, status, doc)
        return {"url": url, "ok": ok, "error": None if ok else f"{status} {doc}"}

    async def load_all(self, url: str, pool: PoolRecord) -> None:
        """Bring a joining engine to the pool's adapters."""
        for name, path in pool.adapters.items():
            status, doc = await self.client.call(
                "POST", url + "/load_lora_adapter", {"lora_name": name, "lora_path": path}
            )
            if status != 200:
                raise PlatformError(ErrorCode.ENGINE_ERROR, f"{url} could not load LoRA {name}: {doc}")

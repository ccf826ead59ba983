"""Templates: the built-in ``default`` of the configured backend plus those registered in Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from services.protocol import keys
from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Template
from services.protocol.status import ErrorCode
from services.sandbox_broker.settings import BrokerSettings


def default_template(settings: BrokerSettings) -> Template:
    """The host's /usr on ``local``, the prepared image on ``docker``, the E2B template on ``e2b``."""
    image = {"local": None, "docker": settings.docker_image, "e2b": settings.e2b_template}[settings.backend]
    return Template(name="default", image=image, warm_pool=settings.default_warm_pool)


CACHE_S = 2.0  # how stale a template read from Redis may be (another replica's registration)


class Templates:
    def __init__(self, client: aioredis.Redis, default: Template, backend: str) -> None:
        self.client = client
        self.default = default
        self.backend = backend
        self._cache: dict[str, tuple[float, Template | None]] = {}
        self._loading: dict[str, asyncio.Future[Template | None]] = {}
        self._seen: dict[str, Template] = {}  # every registered template read or written here, by name

    async def get(self, name: str) -> Template:
        cached = self._cache.get(name)
        if cached is not None and time.monotonic() - cached[0] < CACHE_S:
            stored = cached[1]
        else:
            stored = await self._reload(name)
        if name == "default":
            return stored or self.default
        if stored is None:
            raise PlatformError(ErrorCode.UNKNOWN_TEMPLATE, f"no template {name!r}", field="template")
        return stored

    async def put(self, template: Template) -> None:
        self.check(template)
        await self.client.hset(keys.broker_templates(), template.name, template.model_dump_json())
        self._cache[template.name] = (time.monotonic(), template)
        self._seen[template.name] = template

    async def restore(self) -> int:
        """After the store lost its state: register again every template this process has seen (one
        registered since by another replica is kept). Returns how many were missing."""
        restored = 0
        for template in list(self._seen.values()):
            restored += int(
                await self.client.hsetnx(keys.broker_templates(), template.name, template.model_dump_json())
            )
        self._cache.clear()
        return restored

    async def all(self) -> list[Template]:
        raw = await self.client.hgetall(keys.broker_templates())
        stored = {t.name: t for t in (Template.model_validate_json(v) for v in raw.values())}
        self._seen.update(stored)
        stored.setdefault("default", self.default)
        return sorted(stored.values(), key=lambda t: t.name)

    def check(self, template: Template) -> None:
        """Refuse templates this backend cannot run (a request error)."""
        if self.backend in ("docker", "e2b") and not template.image:
            raise PlatformError(ErrorCode.BAD_REQUEST, f"the {self.backend} backend needs an image", field="image")

    def _reload(self, name: str) -> asyncio.Future[Template | None]:
        """The template read again, once for all the requests that found it stale at the same time (a
        burst of leases after a quiet spell: one read, not one per request, each on a pooled connection)."""
        loading = self._loading.get(name)
        if loading is None:
            loading = self._loading[name] = asyncio.ensure_future(self._load(name))
            loading.add_done_callback(lambda done: self._loaded(name, done))
        return asyncio.shield(loading)  # a request that gives up does not cancel the others' read

    def _loaded(self, name: str, done: asyncio.Future[Template | None]) -> None:
        del self._loading[name]
        if not done.cancelled() and done.exception() is None:
            self._cache[name] = (time.monotonic(), done.result())

    async def _load(self, name: str) -> Template | None:
        raw = await self.client.hget(keys.broker_templates(), name)
        if not raw:
            return None
        template = self._seen[name] = Template.model_validate_json(raw)
        return template

"""Who may call what on the proxy (docs/security.md).

- ``/healthz``, ``/metrics``, ``/openapi.json``: anyone (no secrets in them);
- ``/e/{session}/...`` (the agent gateway): the session's own token, checked by the gateway;
- ``/admin/*``: the admin token; ``/admin/weights`` and ``/admin/lora`` also a job's token, for
  the pool its job is bound to only (the trainer's ``ROLLOUT_TRAIN_PROXY_TOKEN``);
- data plane (``/generate``, ``/v1/*``): any valid token when ``require_token`` is on (or when a
  token is sent); a call is counted per job in ``rollout_proxy_job_calls``: a job token's own job,
  or ``X-Rollout-Job`` from a service-token caller (the workers serve every job).
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
from aiohttp import web
from redis.asyncio import Redis

from services.llm_proxy.errors import Handler
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.responses import CallRequest, error_response
from services.llm_proxy.settings import ProxySettings
from services.protocol import ErrorCode, PlatformError, keys
from services.protocol.llm import HEADER_JOB
from services.runtime.auth import Authenticator, Principal, TokenSet

PUBLIC = frozenset({"/healthz", "/metrics", "/openapi.json"})
GATEWAY = "/e/"  # agent gateway sessions: authenticated by their own session token (gateway/sessions.py)
POOL_SCOPED = frozenset({"/admin/weights", "/admin/lora"})
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
CACHE_S = 5.0  # how long a job token's job and a job's pool are reused by one process


def authenticator(settings: ProxySettings) -> Authenticator:
    admin, service = TokenSet.parse(settings.admin_token), TokenSet.parse(settings.service_token)
    if not (admin or settings.allow_anonymous):
        raise ValueError(
            "the proxy has no admin token: set ROLLOUT_ADMIN_TOKEN (or ROLLOUT_PROXY_ADMIN_TOKEN) "
            "(or ROLLOUT_PROXY_ALLOW_ANONYMOUS=true on a development machine)"
        )
    return Authenticator(admin, service, settings.allow_anonymous)


class ProxyAuth:
    def __init__(self, settings: ProxySettings, redis: Redis, metrics: ProxyMetrics) -> None:
        self.auth = authenticator(settings)
        self.require_token = settings.require_token
        self.redis = redis
        self.metrics = metrics
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC or request.path.startswith(GATEWAY):
            return await handler(request)
        try:
            if request.path.startswith("/admin/"):
                await self._admin(request)
            else:
                await self.data_plane(request)
        except PlatformError as exc:
            return error_response(exc)
        return await handler(request)

    async def _admin(self, request: web.Request) -> None:
        caller = await self._resolve(request.headers.get("Authorization"))
        if caller.role == "job" and request.path in POOL_SCOPED and request.method == "POST":
            await self._check_pool(request, caller)
        else:
            caller.require_admin()

    async def data_plane(self, request: CallRequest) -> None:
        """A data-plane call: its token checked (raises ``PlatformError``) and counted for its job."""
        header = request.headers.get("Authorization")
        if header is None and not self.require_token:
            self.metrics.tally.count(self.metrics.job("anonymous"))
            return
        caller = await self._resolve(header)
        claimed = request.headers.get(HEADER_JOB, "")
        job = caller.job if caller.role == "job" else (claimed if JOB_NAME.match(claimed) else "unattributed")
        self.metrics.tally.count(self.metrics.job(str(job)))

    async def _resolve(self, header: str | None) -> Principal:
        key = ("token", header or "")
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < CACHE_S:
            principal: Principal = cached[1]
            return principal
        principal = await self.auth.resolve(self.redis, header)
        if principal.role == "job":  # only job lookups cost a Redis round trip; settings tokens are not cached
            self._cache[key] = (time.monotonic(), principal)
        return principal

    async def _check_pool(self, request: web.Request, caller: Principal) -> None:
        try:
            doc = orjson.loads(await request.read())  # aiohttp keeps the body for the handler
        except orjson.JSONDecodeError:
            return  # the handler answers 400 for the body itself
        pool = doc.get("pool") if isinstance(doc, dict) else None
        bound = await self._job_pool(caller.job or "")
        if pool != bound:
            raise PlatformError(ErrorCode.FORBIDDEN, f"job {caller.job!r} may change only its own pool {bound!r}")

    async def _job_pool(self, job: str) -> str | None:
        key = ("pool", job)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < CACHE_S:
            return cached[1]  # type: ignore[no-any-return]
        raw: Any = await self.redis.hget(keys.job_record(job), "pool")
        pool = raw.decode() if isinstance(raw, bytes) else raw
        self._cache[key] = (time.monotonic(), pool)
        return pool

"""What every route needs, built once per process in ``create_app`` and reached through dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request
from redis.asyncio import Redis

from services.rollout_api.auth import Caller, resolve_caller
from services.rollout_api.metrics import ApiMetrics
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.settings import ApiSettings
from services.rollout_api.templates import TemplateCatalog


@dataclass
class ApiContext:
    settings: ApiSettings
    redis: Redis  # bytes in, bytes out (decode_responses=False)
    streams: Redis  # a separate pool for blocking reads (SSE): subscribers never starve other routes
    scripts: Scripts
    http: httpx.AsyncClient
    templates: TemplateCatalog
    metrics: ApiMetrics


async def get_context(request: Request) -> ApiContext:  # async: a plain def runs in a thread
    ctx: ApiContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ApiContext, Depends(get_context)]


async def get_caller(request: Request, ctx: Ctx) -> Caller:
    return await resolve_caller(ctx.redis, ctx.settings.admin_token, request.headers.get("authorization"))


AuthCaller = Annotated[Caller, Depends(get_caller)]

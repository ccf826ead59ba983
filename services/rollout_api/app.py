"""The rollout API application: ``create_app(settings, redis)``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.rollout_api import jobs, rollouts, sse
from services.rollout_api.context import ApiContext, Ctx
from services.rollout_api.dashboard import routes as dashboard
from services.rollout_api.metrics import ApiMetrics
from services.rollout_api.redis_scripts import Scripts
from services.rollout_api.settings import ApiSettings
from services.rollout_api.templates import TemplateCatalog
from services.runtime.gc_tuning import tune_gc
from services.runtime.generation import StoreGeneration
from services.runtime.http_errors import install_error_handlers
from services.runtime.redis_pool import observe_pools, open_redis
from services.runtime.settings import RedisSettings
from services.runtime.slow_clients import ClientLimits, ConnectionCollector, ConnectionStats
from services.runtime.tasks import cancel_and_wait

STORE_CHECK_S = 5.0  # how often the store's generation is read (services/runtime/generation.py)


def http_client(settings: ApiSettings) -> httpx.AsyncClient:
    """The API's HTTP client with its pool sized by settings (httpx's default is a silent 100)."""
    size = settings.http_connections
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(5.0, pool=settings.http_pool_wait_s))


def create_app(
    settings: ApiSettings,
    redis_url: str,
    redis_settings: RedisSettings | None = None,
    connections: tuple[ClientLimits, ConnectionStats] | None = None,  # the server's, for /metrics
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = open_redis(redis_url, redis_settings)
        streams = open_redis(redis_url, redis_settings, size=settings.sse_connections)
        metrics = ApiMetrics()
        observe_pools(metrics.registry, "api", {"commands": redis, "streams": streams})
        if connections is not None:
            metrics.registry.register(ConnectionCollector("rollout_api", *connections))
        async with http_client(settings) as http:
            metrics.observe_http(http, settings.http_connections)
            app.state.ctx = ApiContext(
                settings=settings, redis=redis, streams=streams, scripts=Scripts(redis), http=http,
                templates=TemplateCatalog(settings.broker_url, settings.template_cache_s, settings.client_token()),
                metrics=metrics,
            )  # fmt: skip
            app.state.dashboard = dashboard.build(settings, redis, http)
            sampling = asyncio.create_task(app.state.dashboard.sampler.run(), name="dashboard-sampler")
            app.state.generation = StoreGeneration("api")
            following = asyncio.create_task(app.state.generation.follow(redis, STORE_CHECK_S), name="generation")
            tune_gc(settings.gc_young_threshold)
            try:
                yield
            finally:
                await cancel_and_wait(following)
                await cancel_and_wait(sampling)
                await streams.aclose(close_connection_pool=True)
                await redis.aclose(close_connection_pool=True)

    app = FastAPI(title="rollout API", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(rollouts.router)
    app.include_router(sse.router)
    dashboard.install(app)

    @app.middleware("http")
    async def count_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        ctx: ApiContext = request.app.state.ctx
        ctx.metrics.requests.labels(path, str(response.status_code)).inc()
        ctx.metrics.latency.labels(path).observe(time.perf_counter() - started)
        return response

    @app.get("/healthz")
    async def healthz(ctx: Ctx) -> dict[str, Any]:
        await ctx.redis.ping()
        generation = getattr(app.state, "generation", None)
        return {"status": "ok", **(generation.health() if generation is not None else {})}

    @app.get("/metrics")
    async def metrics(ctx: Ctx) -> Response:
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

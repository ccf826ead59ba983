"""``create_app(settings, redis_url)``: one proxy process's aiohttp application."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from aiohttp import web

from services.llm_proxy.admin import Admin
from services.llm_proxy.admission import Admission
from services.llm_proxy.auth import ProxyAuth, authenticator
from services.llm_proxy.calls import Forwarder
from services.llm_proxy.client_limits import ClientGuard
from services.llm_proxy.errors import Handler, error_bodies
from services.llm_proxy.fleet import FleetView
from services.llm_proxy.gateway.metrics import GatewayMetrics
from services.llm_proxy.gateway.service import Gateway
from services.llm_proxy.health import HealthChecker
from services.llm_proxy.limits import process_limits, queue_limits
from services.llm_proxy.membership import MembershipStore
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.openapi import document
from services.llm_proxy.responses import json_response
from services.llm_proxy.settings import ProxySettings
from services.llm_proxy.upstream import BackgroundTasks, EngineClient, create_session
from services.llm_proxy.weights import WeightTransaction
from services.runtime.generation import StoreGeneration
from services.runtime.redis_pool import open_redis, pool_of
from services.runtime.settings import RedisSettings
from services.runtime.slow_clients import ClientLimits

VIEW = web.AppKey("view", FleetView)
METRICS = web.AppKey("metrics", ProxyMetrics)
AUTH = web.AppKey("auth", ProxyAuth)
CLIENTS = web.AppKey("clients", ClientGuard)  # the server installs it on its connections (server.py)
FORWARDER = web.AppKey("forwarder", Forwarder)  # the server sends data-plane calls to it first (data_plane.py)
# each serving process follows the store's generation for its /healthz; the parent says it in the log
GENERATION = web.AppKey("generation", StoreGeneration)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    return await request.app[AUTH].middleware(request, handler)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "pid": os.getpid(), **request.app[GENERATION].health()})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render(), content_type="text/plain")


async def openapi(request: web.Request) -> web.Response:
    return json_response(document())


async def models(request: web.Request) -> web.Response:
    """``/v1/models``: one model per pool (the OpenAI ``model`` field names the pool)."""
    pools = request.app[VIEW].fleet.pools
    data = [{"id": name, "object": "model", "owned_by": "rollout", "root": p.location} for name, p in pools.items()]
    return json_response({"object": "list", "data": data})


def create_app(settings: ProxySettings, redis_url: str) -> web.Application:
    authenticator(settings)  # no admin token and no development flag: refuse to start
    proxy_metrics = ProxyMetrics()
    limits = ClientLimits(settings.http_header_timeout_s, settings.http_body_timeout_s, settings.http_keepalive_s)
    clients = ClientGuard(limits, proxy_metrics)
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[clients.middleware, error_bodies, authenticate])  # fmt: skip
    app[METRICS] = proxy_metrics
    app[CLIENTS] = clients
    app[GENERATION] = generation = StoreGeneration("proxy", announce=False)
    gateway_metrics = GatewayMetrics(proxy_metrics.registry)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/openapi.json", openapi)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        redis = open_redis(redis_url, RedisSettings())
        store = MembershipStore(redis)
        view = FleetView(store, settings.sync_interval_s, settings.eject_after_failures)
        await view.refresh()
        app[VIEW] = view
        app[AUTH] = ProxyAuth(settings, redis, proxy_metrics)
        session = create_session(settings)
        background = BackgroundTasks()
        admission = Admission(queue_limits(settings), proxy_metrics)
        proxy_metrics.limits(process_limits(settings, session))
        app[FORWARDER] = forwarder = Forwarder(settings, view, store, session, proxy_metrics, background, admission)
        for path in ("/generate", "/v1/chat/completions", "/v1/completions"):
            app.router.add_post(path, forwarder.handle)
        gateway = Gateway(settings, forwarder, redis, view, gateway_metrics)
        gateway.add_routes(app)
        control = EngineClient(session, settings.engine_call_timeout_s)
        transaction = WeightTransaction(redis, store, control, settings.lock_ttl_s, settings.update_settle_s)
        Admin(view, store, control, transaction, proxy_metrics).add_routes(app)
        checker = HealthChecker(
            view, EngineClient(session, settings.health_timeout_s), session, proxy_metrics, pool_of(redis),
            lean_connections=lambda: forwarder.links.connections,
        )  # fmt: skip
        await checker.check_all()
        proxy_metrics.tally.watch_in_flight(
            lambda: {rt.engine_id: rt.in_flight for rt in view.runtime.values()},
            lambda engine: proxy_metrics.engine(engine).in_flight,
        )
        tasks = [
            asyncio.create_task(view.follow(redis), name="membership"),
            asyncio.create_task(checker.run(settings.health_interval_s), name="health"),
            asyncio.create_task(proxy_metrics.tally.run(), name="metrics"),
            asyncio.create_task(generation.follow(redis, settings.store_check_s), name="store generation"),
        ]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await background.drain()
        await session.close()
        await forwarder.links.close()
        gateway.close()
        await redis.aclose()

    app.cleanup_ctx.append(lifecycle)
    return app

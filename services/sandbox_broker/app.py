"""The broker's HTTP app (routes in ``services.protocol.sandboxes``): ``create_app(settings, redis_url)``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecChunk, ExecRequest, GatewayBinding, Lease, Template
from services.protocol.status import ErrorCode
from services.runtime.gc_tuning import tune_gc
from services.runtime.http_errors import install_error_handlers
from services.runtime.redis_pool import observe_pools, open_redis
from services.runtime.settings import RedisSettings
from services.runtime.slow_clients import ClientLimits, ConnectionCollector, ConnectionStats
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker import hot_routes
from services.sandbox_broker.auth import Caller, Callers, authenticator, hide_others, listed_job, sandbox_access
from services.sandbox_broker.backends import make_backend
from services.sandbox_broker.backends.create_phases import PhaseClock
from services.sandbox_broker.backends.launch_ns import LaunchNamespace
from services.sandbox_broker.broker import Broker
from services.sandbox_broker.leases import LeaseStore
from services.sandbox_broker.metrics import BrokerMetrics, LaunchCollector, PhaseCollector
from services.sandbox_broker.reaper import Reaper
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.template_sources import checked_template
from services.sandbox_broker.templates import Templates, default_template

log = logging.getLogger(__name__)


def create_app(
    settings: BrokerSettings, redis_url: str, connections: tuple[ClientLimits, ConnectionStats] | None = None
) -> FastAPI:
    metrics = BrokerMetrics()
    if connections is not None:  # the server's client connections (services/runtime/slow_clients.py)
        metrics.registry.register(ConnectionCollector("rollout_broker", *connections))
    auth = authenticator(settings)  # refuses to build a broker with no tokens (unless anonymous is allowed)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # redis-py's default pool fails past 100 connections in use: a hidden cap. Wait for one instead.
        client = open_redis(redis_url, RedisSettings(), size=settings.redis_connections)
        observe_pools(metrics.registry, "broker", {"commands": client})
        store = LeaseStore(client, settings.ttl_grace_s)
        templates = Templates(client, default_template(settings), settings.backend)
        broker = Broker(settings, make_backend(settings), store, templates, metrics)
        if isinstance(phases := getattr(broker.backend, "phases", None), PhaseClock):
            metrics.registry.register(PhaseCollector(phases))
        if isinstance(launch := getattr(broker.backend, "launch", None), LaunchNamespace):
            metrics.registry.register(LaunchCollector(launch))
        await broker.start()
        reaper = Reaper(broker, client)
        await reaper.start()
        broker.start_pools(await templates.all())
        app.state.broker = broker
        app.state.redis = client
        app.state.auth = Callers(auth)  # the settings' tokens resolved once
        log.info("broker %s ready: backend %s, isolation %s", broker.instance, settings.backend, broker.capabilities)
        tune_gc(settings.gc_young_threshold)
        try:
            yield
        finally:
            await reaper.stop()
            await broker.quiesce()
            await reaper.final_sweep()  # nothing left on the host that no lease record holds
            await broker.close()
            await reaper.retire()
            store.close()
            await client.aclose(close_connection_pool=True)

    app = FastAPI(title="rollout sandbox broker", lifespan=lifespan)
    install_error_handlers(app, lambda code: metrics.errors.labels(code.value).inc())
    _install_routes(app, settings, metrics)
    hot_routes.install(app)  # lease, exec, renew, release: without FastAPI's per-request machinery
    return app


async def _broker(request: Request) -> Broker:  # async: FastAPI runs a plain ``def`` in its thread pool
    broker: Broker = request.app.state.broker
    return broker


BrokerDep = Annotated[Broker, Depends(_broker)]


async def _sandbox_lease_id(lease_id: str, request: Request, broker: BrokerDep) -> str:
    return await sandbox_access(lease_id, request, broker)


SandboxLeaseId = Annotated[str, Depends(_sandbox_lease_id)]  # exec and files: a lease token too


def _install_routes(app: FastAPI, settings: BrokerSettings, metrics: BrokerMetrics) -> None:
    @app.get("/healthz")
    async def healthz(broker: BrokerDep) -> dict[str, object]:
        return {"status": "ok", "backend": settings.backend, "instance": broker.instance,
                "isolation": broker.capabilities, "pools": await broker.pools.current_sizes(),
                "waiting": broker.admission.waiting, **broker.generation.health()}  # fmt: skip

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/leases")
    async def list_leases(broker: BrokerDep, caller: Caller, job: str | None = None) -> list[Lease]:
        return await broker.list(listed_job(caller, job))

    @app.get("/leases/{lease_id}")
    async def get_lease(lease_id: str, broker: BrokerDep, caller: Caller) -> Lease:
        return hide_others(caller, await broker.get(lease_id))

    @app.post("/leases/{lease_id}/exec/stream")
    async def exec_stream(lease_id: SandboxLeaseId, body: ExecRequest, broker: BrokerDep) -> StreamingResponse:
        await broker.live(lease_id)  # a missing lease is an error response, not an event
        return StreamingResponse(_sse(broker, lease_id, body), media_type="text/event-stream")

    @app.post("/leases/{lease_id}/gateway", status_code=204)
    async def bind_gateway(lease_id: str, body: GatewayBinding, broker: BrokerDep, caller: Caller) -> Response:
        caller.require_service()  # the worker, when it opens the episode's session; never a job or a lease token
        await broker.bind_gateway(lease_id, body)
        return Response(status_code=204)

    @app.put("/leases/{lease_id}/files", status_code=204)
    async def put_file(lease_id: SandboxLeaseId, request: Request, broker: BrokerDep, path: PathQuery) -> Response:
        await broker.write_file(lease_id, path, await _body(request, settings))
        return Response(status_code=204)

    @app.get("/leases/{lease_id}/files")
    async def get_file(lease_id: SandboxLeaseId, broker: BrokerDep, path: PathQuery) -> Response:
        return Response(await broker.read_file(lease_id, path), media_type="application/octet-stream")

    @app.put("/leases/{lease_id}/archive", status_code=204)
    async def put_archive(lease_id: SandboxLeaseId, request: Request, broker: BrokerDep, path: PathQuery) -> Response:
        await broker.put_archive(lease_id, path, await _body(request, settings))
        return Response(status_code=204)

    @app.get("/leases/{lease_id}/archive")
    async def get_archive(lease_id: SandboxLeaseId, broker: BrokerDep, path: PathQuery) -> Response:
        return Response(await broker.get_archive(lease_id, path), media_type="application/x-tar")

    @app.post("/templates", status_code=201)
    async def register_template(body: Template, broker: BrokerDep, caller: Caller) -> Template:
        caller.require_admin()
        body = checked_template(body, settings.backend, settings.template_roots, settings.template_images)
        broker.check_isolation(body.isolation)
        await broker.templates.put(body)
        broker.pools.ensure(body)
        return body

    @app.get("/templates")
    async def list_templates(broker: BrokerDep, caller: Caller) -> list[Template]:
        return await broker.templates.all()


PathQuery = Annotated[str, Query(min_length=1, max_length=4096, pattern=r"^[^\x00]*$")]


async def _body(request: Request, settings: BrokerSettings) -> bytes:
    size = int(request.headers.get("content-length") or 0)
    if size > settings.max_file_bytes:
        raise PlatformError(ErrorCode.PAYLOAD_TOO_LARGE, f"body over {settings.max_file_bytes} bytes")
    body = await request.body()
    if len(body) > settings.max_file_bytes:
        raise PlatformError(ErrorCode.PAYLOAD_TOO_LARGE, f"body over {settings.max_file_bytes} bytes")
    return body


async def _sse(broker: Broker, lease_id: str, request: ExecRequest) -> AsyncIterator[bytes]:
    """Output chunks as they come, then one event with the result (or the error)."""
    queue: asyncio.Queue[ExecChunk | None] = asyncio.Queue()

    async def sink(stream: str, data: bytes) -> None:
        queue.put_nowait(ExecChunk(stream=stream, data=data.decode(errors="replace")))

    async def run() -> None:
        try:
            result = await broker.exec(lease_id, request, sink)
            queue.put_nowait(ExecChunk(stream="result", result=result))
        except PlatformError as exc:
            queue.put_nowait(ExecChunk(stream="result", data=exc.body().model_dump_json()))
        finally:
            queue.put_nowait(None)

    task = asyncio.get_running_loop().create_task(run())
    try:
        while (chunk := await queue.get()) is not None:
            yield f"data: {chunk.model_dump_json()}\n\n".encode()
    finally:
        await cancel_and_wait(task)

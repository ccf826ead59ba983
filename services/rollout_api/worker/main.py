"""Run a rollout worker: settings in, an asyncio process out (``/healthz`` and ``/metrics`` on a port)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio import Redis

from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker import grading
from services.rollout_api.worker.agent import AgentDeps
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import new_session
from services.rollout_api.worker.metrics import WorkerMetrics
from services.rollout_api.worker.outages import BROKER, PROXY, Breaker, Outages
from services.rollout_api.worker.proxy_client import ProxyClient
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.rollout_api.worker.warm_claims import WarmClaims
from services.rollout_api.worker.worker import Worker
from services.runtime.gc_tuning import tune_gc
from services.runtime.http_client import HttpClient
from services.runtime.limits import raise_fd_limit
from services.runtime.logs import configure_logging
from services.runtime.net import free_port
from services.runtime.redis_pool import observe_pools, open_redis
from services.runtime.settings import RedisSettings

log = logging.getLogger(__name__)


def status_app(worker: Worker, metrics: WorkerMetrics) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        await worker.redis.ping()
        return web.json_response({"status": "ok", "worker": worker.name, "running": len(worker.running),
                                  **worker.generation.health()})  # fmt: skip

    async def metrics_route(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_route)
    return app


def make_outages(settings: WorkerSettings, session: aiohttp.ClientSession, metrics: WorkerMetrics) -> Outages:
    breakers = {
        name: Breaker(name, url.rstrip("/") + "/healthz", session, settings.probe_interval_s, metrics)
        for name, url in ((PROXY, settings.proxy_url), (BROKER, settings.broker_url))
    }
    for name in breakers:
        metrics.dependency_up.labels(name).set(1)
    return Outages(breakers, settings.outage_budget_s)


async def serve(settings: WorkerSettings, redis_url: str) -> None:
    if settings.model_path is None:
        raise SystemExit(
            "ROLLOUT_WORKER_MODEL_PATH (--model-path) is required: the tokenizer directory "
            "(`rollout tokenizer write DIR` writes the bundled one; or the served model's directory)"
        )
    tokenizer = ChatTokenizer.from_dir(settings.model_path)
    by_pool = {pool: ChatTokenizer.from_dir(path) for pool, path in settings.pool_model_paths.items()}
    worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    metrics = WorkerMetrics(settings.concurrency)
    metrics.grade_change_max_bytes.set(grading.MAX_CHANGE_BYTES)
    raise_fd_limit()
    redis = open_redis(redis_url, RedisSettings())
    observe_pools(metrics.registry, "worker", {"commands": redis})
    async with new_session() as session:
        outages = make_outages(settings, session, metrics)
        deps = AgentDeps(
            proxy=ProxyClient(session, settings.proxy_url.rstrip("/"), settings.llm_timeout_s, outages,
                              token=settings.client_token(), on_wait=lambda _: metrics.llm_capacity_waits.inc()),
            broker=BrokerClient(session, settings.broker_url.rstrip("/"), settings.broker_timeout_s, outages,
                                token=settings.client_token(), batch_window_s=settings.lease_batch_window_s,
                                on_batch=functools.partial(_batched, metrics),
                                claims=_warm_claims(settings, redis, metrics)),
            tokenizer=tokenizer, settings=settings, worker_id=worker_id, metrics=metrics, pool_tokenizers=by_pool,
            redis=redis, outages=outages,
        )  # fmt: skip
        worker = Worker(redis, deps, metrics)
        for name, client in ((PROXY, deps.proxy.http), (BROKER, deps.broker.http)):
            metrics.http_connections.labels(name).set_function(functools.partial(_connections, client))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        runner = web.AppRunner(status_app(worker, metrics), access_log=None)
        await runner.setup()
        port = settings.port or free_port(settings.host)
        await web.TCPSite(runner, settings.host, port).start()
        log.info("worker %s: %d slots, status on http://%s:%d", worker_id, settings.concurrency, settings.host, port)
        tune_gc(settings.gc_young_threshold)  # its tokenizers' vocabularies above all: never walked again
        try:
            await worker.run()
        finally:
            await outages.close()
            await deps.proxy.close()
            await deps.broker.close()
            await runner.cleanup()
            await redis.aclose()
    log.info("worker %s stopped", worker_id)


def _batched(metrics: WorkerMetrics, leases: int) -> None:
    metrics.lease_batches.inc()
    metrics.batched_leases.inc(leases)


def _warm_claims(settings: WorkerSettings, redis: Redis, metrics: WorkerMetrics) -> WarmClaims | None:
    return WarmClaims(redis, functools.partial(_claims, metrics)) if settings.warm_claims else None


def _claims(metrics: WorkerMetrics, claimed: int, asked: int) -> None:
    metrics.lease_claims.labels("claimed").inc(claimed)
    metrics.lease_claims.labels("left_to_broker").inc(asked - claimed)


def _connections(client: HttpClient) -> float:
    return float(client.connections)


def run(settings: WorkerSettings) -> int:
    """On uvloop, as the proxy and the engines: a worker's CPU is HTTP client calls, hundreds in flight."""
    import uvloop  # comes with uvicorn[standard]

    configure_logging(settings.log_level)
    uvloop.run(serve(settings, settings.require_redis_url()))
    return 0

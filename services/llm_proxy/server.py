"""The proxy's processes: a parent that owns Redis (embedded when no URL is set) and seeds
membership, and ``workers`` children, each with its own SO_REUSEPORT socket on the same port so
the kernel spreads long-lived connections evenly. A child that dies is started again."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.process import BaseProcess

import redis
import uvloop  # comes with uvicorn[standard]
from aiohttp import web
from prometheus_client import multiprocess, values

from services.llm_proxy import data_plane
from services.llm_proxy.app import CLIENTS, METRICS, create_app
from services.llm_proxy.auth import authenticator
from services.llm_proxy.lean_server import LeanServer
from services.llm_proxy.limits import MAX_FIELD_BYTES, MAX_HEADERS, MAX_LINE_BYTES, listen_backlog
from services.llm_proxy.membership import MembershipStore
from services.llm_proxy.settings import ProxySettings
from services.protocol.redis_url import redis_target
from services.runtime.gc_tuning import freeze_heap, tune_gc
from services.runtime.generation import StoreGeneration
from services.runtime.limits import raise_fd_limit
from services.runtime.logs import configure_logging
from services.runtime.outages import STORE_ERRORS, Outage
from services.runtime.owned_dirs import owned_tempdir
from services.runtime.processes import die_with_parent
from services.runtime.redis_pool import open_redis
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.settings import RedisSettings
from services.runtime.sync_redis import open_sync_redis

log = logging.getLogger(__name__)

SHUTDOWN_S = 3.0  # calls in progress at SIGTERM get this long to answer


async def serve_worker(settings: ProxySettings, redis_url: str) -> None:
    app = create_app(settings, redis_url)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_S, max_line_size=MAX_LINE_BYTES,
        max_field_size=MAX_FIELD_BYTES, max_headers=MAX_HEADERS, keepalive_timeout=settings.http_keepalive_s,
    )  # fmt: skip
    await runner.setup()
    assert runner.server is not None
    app[CLIENTS].install(runner.server)  # slow clients cut off (client_limits.py)
    plane = data_plane.install(runner.server, app)  # data-plane calls ahead of the router and middlewares
    lean = LeanServer(runner.server, plane, app[CLIENTS], app[METRICS], settings.max_body_bytes)  # no aiohttp objects
    lean.gateway_from(app)
    loop = asyncio.get_running_loop()
    listening = await loop.create_server(
        lean, settings.host, settings.port, reuse_port=True, backlog=listen_backlog(settings, warn=True)
    )
    tune_gc(settings.gc_young_threshold)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listening.close()
    await lean.shutdown(SHUTDOWN_S)
    await runner.cleanup()


def worker_main(settings: ProxySettings, redis_url: str, parent_pid: int) -> None:
    """Entry point of one child process, a fork of the parent; it ends when the parent dies (even
    by ``kill -9``)."""
    for sig in (signal.SIGTERM, signal.SIGINT):  # the parent's handlers only set its flag
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(parent_pid)
    # the parent imported prometheus_client before PROMETHEUS_MULTIPROC_DIR was set: multiprocess mode here
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    configure_logging(settings.log_level)
    uvloop.run(serve_worker(settings, redis_url))


async def seed_membership(settings: ProxySettings, redis_url: str) -> None:
    redis = open_redis(redis_url, RedisSettings())
    try:
        await MembershipStore(redis).seed(settings.pool_map())
    finally:
        await redis.aclose()


class StoreWatch:
    """The parent's look at the store every ``store_check_s``: when Redis lost its state, the
    configured pools and engines are registered again (the children follow membership)."""

    def __init__(self, settings: ProxySettings, redis_url: str) -> None:
        self.settings, self.redis_url = settings, redis_url
        self.generation = StoreGeneration("proxy")
        self.outage = Outage("Redis (store generation)", log)
        self.due = 0.0
        target = redis_target(redis_url)
        self.client = (open_sync_redis(redis_url) if target.cluster else  # never blocks the supervision long
                       redis.Redis.from_url(target.url, socket_timeout=2.0, socket_connect_timeout=2.0))  # fmt: skip

    def check(self) -> None:
        if time.monotonic() < self.due:
            return
        self.due = time.monotonic() + self.settings.store_check_s
        try:
            if self.generation.observe(self.client):
                asyncio.run(seed_membership(self.settings, self.redis_url))
                log.warning("proxy: configured pools registered again: %s", ", ".join(self.settings.pool_map()))
            self.outage.ok()
        except STORE_ERRORS as exc:
            self.outage.failed(exc)


def run(settings: ProxySettings) -> int:
    """Run the parent until SIGTERM/SIGINT; returns the exit code."""
    configure_logging(settings.log_level)
    authenticator(settings)  # no admin token and no development flag: refuse here, not in a crash-looping child
    soft, _ = raise_fd_limit()  # one socket per call each way: the children inherit it
    log.info("open-file limit %d per process", soft)
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with (
        redis_url_or_embedded(settings.redis_url) as redis_url,
        owned_tempdir("proxy-prom-") as prom,  # a kill -9 leaves it only until the next proxy starts
    ):
        asyncio.run(seed_membership(settings, redis_url))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = prom  # children aggregate /metrics across processes
        # a worker, started or restarted, is a fork of this process, which has imported the proxy's
        # modules (no thread runs here): not a fresh interpreter importing ~680 modules (0.9 s of CPU)
        ctx = multiprocessing.get_context("fork")

        def start() -> BaseProcess:
            proc = ctx.Process(target=worker_main, args=(settings, redis_url, os.getpid()), daemon=True)
            proc.start()
            return proc

        freeze_heap()  # each worker's start-up collection (tune_gc) would walk and copy this heap
        children = [start() for _ in range(settings.workers)]
        log.info("proxy on %s:%d with %d worker processes", settings.host, settings.port, settings.workers)
        store = StoreWatch(settings, redis_url)
        while not stopping:
            store.check()
            for i, child in enumerate(children):
                child.join(timeout=0.2)
                if child.exitcode is not None and not stopping:
                    log.error("proxy worker %d exited with %s; starting another", child.pid, child.exitcode)
                    if child.pid is not None:
                        multiprocess.mark_process_dead(child.pid)  # type: ignore[no-untyped-call]
                    children[i] = start()
        for child in children:
            child.terminate()
        for child in children:
            child.join(timeout=10)
            if child.exitcode is None:
                child.kill()
    return 0

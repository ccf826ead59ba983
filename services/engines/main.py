"""Serve ``settings.count`` engines from one process, on consecutive ports."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from services.engines.app import create_app
from services.engines.registration import join_and_watch, leave_pool
from services.engines.settings import EngineSettings
from services.runtime.logs import configure_logging
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


async def serve(settings: EngineSettings) -> None:
    """Run until SIGTERM or SIGINT."""
    runners = []
    for i in range(settings.count):
        port = settings.port + i
        runner = web.AppRunner(
            create_app(settings, port), handler_cancellation=True, access_log=None, shutdown_timeout=3.0
        )
        await runner.setup()
        await web.TCPSite(runner, settings.host, port, backlog=4096).start()
        runners.append(runner)
    log.info("%d %s engine(s) on %s:%d-%d", settings.count, settings.mode, settings.host, settings.port, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = await join_and_watch(settings)
    await stop.wait()
    await cancel_and_wait(watch)
    await asyncio.to_thread(leave_pool, settings)
    for runner in runners:
        await runner.cleanup()


def run(settings: EngineSettings) -> int:
    configure_logging(settings.log_level)
    if settings.mode == "sglang":
        from services.engines import sglang

        return sglang.run(settings)
    import uvloop  # comes with uvicorn[standard]

    uvloop.run(serve(settings))
    return 0

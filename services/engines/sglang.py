"""``rollout engine --mode sglang``: start a real SGLang server with the flags the platform relies
on, wait until it is healthy, join the proxy pool, and stop it with the process.

The flags (SGLang's ``launch_server``): ``--context-length`` from the platform's cap (the proxy's
guard and the engine agree on the longest prompt + reply), ``--enable-metrics`` (the dashboard and
the saturation metrics read ``sglang:*``), ``--weight-version`` (every answer's provenance),
``--served-model-name``, ``--max-running-requests``, ``--tp-size``, optionally
``--mem-fraction-static`` and ``--enable-return-routed-experts`` (routing replay for MoE). The
weight-update endpoints (``/update_weights_from_disk``, ``/pause_generation``, ...) are always
served. SGLang binds ``host``: keep it a private address the proxy reaches; the proxy is the only
client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import httpx
from aiohttp import web

from services.engines.registration import join_and_watch, leave_pool, stage_port
from services.engines.settings import EngineSettings
from services.engines.staging import add_stage_route
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def sglang_argv(settings: EngineSettings, python: str = sys.executable) -> list[str]:
    """The command line of one SGLang server for these settings."""
    if settings.model_path is None:
        raise ValueError(
            "sglang mode needs model_path (ROLLOUT_ENGINE_MODEL_PATH / --model-path): an HF model directory"
        )
    if settings.count != 1:
        raise ValueError("sglang mode serves one engine per process (count=1); run one process per engine")
    argv = [
        python, "-m", "sglang.launch_server",
        "--model-path", str(settings.model_path),
        "--host", settings.host,
        "--port", str(settings.port),
        "--served-model-name", settings.served_model_name,
        "--context-length", str(settings.context_length),
        "--max-running-requests", str(settings.max_running_requests),
        "--tp-size", str(settings.tp_size),
        "--weight-version", settings.weight_version,
        "--random-seed", str(settings.seed),
        "--enable-metrics",
    ]  # fmt: skip
    if settings.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(settings.mem_fraction_static)]
    if settings.return_routed_experts:
        argv.append("--enable-return-routed-experts")
    return argv + list(settings.sglang_args)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll SGLang's ``/health`` until it answers 200; fail early if the server exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the SGLang server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"the SGLang server at {url} was not healthy within {timeout_s:.0f} s")


async def _serve(settings: EngineSettings) -> int:
    argv = sglang_argv(settings)
    # the staging site binds first: a taken stage port fails here, before a server is left running
    app = web.Application()
    add_stage_route(app, settings.weight_cache_dir / f"engine-{settings.port}")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, stage_port(settings)).start()
    except BaseException:
        await runner.cleanup()
        raise
    log.info("starting SGLang: %s", " ".join(argv))
    proc = subprocess.Popen(argv, start_new_session=True)  # noqa: ASYNC220 (started once, never waited on here)

    def forward(signum: int) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signum)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, forward, sig)
    watch = None
    try:
        url = f"http://{settings.host}:{settings.port}"
        await asyncio.to_thread(wait_healthy, url, proc, settings.startup_timeout_s)
        watch = await join_and_watch(settings)
        return await asyncio.to_thread(proc.wait)
    finally:
        await cancel_and_wait(watch)
        await asyncio.to_thread(leave_pool, settings)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 60)
        await runner.cleanup()


def run(settings: EngineSettings) -> int:
    """Run the server until it exits or this process is told to stop; returns its exit code.

    Beside it, this process serves ``/rollout/stage_weights`` on ``stage_port`` (default port + 1):
    exports named by a weight store URL are fetched to this host and verified before a switch.
    """
    return asyncio.run(_serve(settings))

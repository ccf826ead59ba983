"""``agent_start_p50_ms`` of ``rollout bench broker`` (local backend): from asking for a lease to the
agent's first gateway call, the way an episode of a ``command`` agent inside the sandbox starts.

One episode at a time: a (warm) lease, the gateway session bound to it (``POST /leases/{id}/gateway``),
the program of an agent bundle mounted at ``/opt/agents`` started behind the in-sandbox relay
(``gateway_port``). It calls ``$OPENAI_BASE_URL/models`` through the relay, the lease's Unix socket
and the broker's forwarder; the clock stops when that call reaches the upstream, a stand-in for the
proxy that answers at once.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import orjson
from aiohttp import web

from services.benchmarks.broker_load import Load, Outcome
from services.protocol.agents import AGENTS_DIR, BUNDLE_MANIFEST, AgentBundle

BUNDLE = "bench-agent"
PORT = 8399  # the worker's default ``sandbox_gateway_port``
AGENT = """#!/usr/bin/python3
import os, urllib.request
urllib.request.urlopen(os.environ["OPENAI_BASE_URL"] + "/models", timeout=60).read()
"""


def write_bundle(agents_dir: Path) -> None:
    """A one-program bundle the sandbox user can read and run (the broker's ``agents_dir``)."""
    bundle = agents_dir / BUNDLE
    (bundle / "bin").mkdir(parents=True)
    program = bundle / "bin" / "agent"
    program.write_text(AGENT)
    program.chmod(0o755)
    manifest = AgentBundle(name=BUNDLE, source="bench", version="0", digest="sha256:", commands=["agent"])
    (bundle / BUNDLE_MANIFEST).write_text(manifest.model_dump_json())
    for directory in (agents_dir, bundle, bundle / "bin"):
        directory.chmod(0o755)


class Upstream:
    """Answers ``/e/{session}/...`` at once and notes when each expected session's first call came."""

    def __init__(self) -> None:
        self._arrivals: dict[str, asyncio.Future[float]] = {}
        self._runner: web.AppRunner | None = None

    def expect(self, session: str) -> asyncio.Future[float]:
        self._arrivals[session] = asyncio.get_running_loop().create_future()
        return self._arrivals[session]

    async def _handle(self, request: web.Request) -> web.Response:
        arrived = self._arrivals.get(request.match_info["session"])
        if arrived is not None and not arrived.done():
            arrived.set_result(time.monotonic())
        return web.json_response({"object": "list", "data": []})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/e/{session}/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def agent_starts(load: Load, n: int, body: dict[str, object]) -> Outcome:
    """n episodes one after another; ``start_ms``: lease asked for -> the agent's first gateway call."""
    outcome, upstream = Outcome(), Upstream()
    url = await upstream.start()
    try:
        for _ in range(n):
            await _one(load, url, upstream, body, outcome)
    finally:
        await upstream.stop()
    return outcome


async def _one(load: Load, url: str, upstream: Upstream, body: dict[str, object], outcome: Outcome) -> None:
    session = secrets.token_hex(12)
    arrived = upstream.expect(session)
    started = time.monotonic()
    lease = await load.create(body, outcome)
    if lease is None:
        return
    outcome.warm += int(lease["warm"])
    try:
        path = f"/leases/{lease['id']}"
        bound = await load.send("POST", f"{path}/gateway", {"session": session, "upstream": url, "ttl_s": 120})
        if bound.status != 204:
            outcome.error(f"gateway {bound.status}: {bound.body[:300].decode(errors='replace')}")
            return
        run = {"argv": [f"{AGENTS_DIR}/{BUNDLE}/bin/agent"], "timeout_s": 60, "gateway_port": PORT,
               "env": {"OPENAI_BASE_URL": f"http://127.0.0.1:{PORT}/e/{session}/v1"}}  # fmt: skip
        ran = await load.send("POST", f"{path}/exec", run)
        result = orjson.loads(ran.body)
        if ran.status != 200 or result.get("exit_code") != 0 or not arrived.done():
            outcome.error(f"agent {ran.status}: {str(result)[:300]}")
            return
        outcome.start_ms.append((arrived.result() - started) * 1000)
    finally:
        if not await load.release(lease["id"]):
            outcome.error("release failed")

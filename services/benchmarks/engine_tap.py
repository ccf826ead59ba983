"""A recording relay in front of an engine: it passes every request through unchanged and keeps
the ``input_ids`` and ``output_ids`` of each ``/generate`` call, so a benchmark can check that the
gateway recorded exactly what the engine was given and generated. It runs on its own thread and
event loop (the proxy health-checks it while the caller blocks on the proxy's start)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import aiohttp
import orjson
from aiohttp import web

from services.runtime.net import free_port

Pair = tuple[tuple[int, ...], tuple[int, ...]]
HOP = {"host", "content-length", "transfer-encoding", "connection"}


class EngineTap:
    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: Counter[Pair] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._client: aiohttp.ClientSession | None = None
        self._thread = threading.Thread(target=self._run, name="engine-tap", daemon=True)

    def __enter__(self) -> EngineTap:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the engine tap did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def generated(self, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """Whether the engine was given ``prompt_ids`` and answered ``output_ids``."""
        with self._lock:
            return self.seen[(tuple(prompt_ids), tuple(output_ids))] > 0

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as client:
            self._client = client
            app = web.Application(client_max_size=256 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._relay)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    async def _relay(self, request: web.Request) -> web.Response:
        assert self._client is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self._client.request(request.method, self.engine_url + request.path_qs, data=body,
                                  headers=headers) as upstream:  # fmt: skip
            payload = await upstream.read()
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP | {"content-encoding"}}
            status = upstream.status
        if request.path == "/generate" and status == 200:
            self._record(body, payload)
        return web.Response(body=payload, status=status, headers=out)

    def _record(self, body: bytes, payload: bytes) -> None:
        try:
            sent, answer = orjson.loads(body), orjson.loads(payload)
            pair = (tuple(sent["input_ids"]), tuple(answer["output_ids"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return  # not a token call (a batch or a text prompt): nothing to compare against
        with self._lock:
            self.seen[pair] += 1

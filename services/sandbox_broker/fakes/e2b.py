"""A local fake of E2B's service for tests and benchmarks, driven by the real ``e2b`` SDK through
``E2B_API_URL`` / ``E2B_SANDBOX_URL`` (or the SDK's ``api_url`` / ``sandbox_url``).

- REST lifecycle: ``POST /v2/sandboxes`` (201), ``GET /v2/sandboxes?metadata=``, ``POST
  /v2/sandboxes/{id}/connect``, ``POST /sandboxes/{id}/timeout``, ``DELETE /sandboxes/{id}``; a
  sandbox dies at its timeout; 429 past the plan's create rate or concurrency cap.
- envd, routed by the ``E2b-Sandbox-Id`` header: ``process.Process/Start`` as a Connect server
  stream of JSON envelopes, ``process.Process/SendSignal``, ``GET/POST /files``, ``GET /health``.
  Commands run in real local bubblewrap sandboxes. A call for a sandbox that is gone, or an
  injected fault, gets the 502 E2B's proxy answers with (which the SDK reports as a timeout).

Run: ``python -m services.sandbox_broker.fakes.e2b --port P --state-dir D``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest
from services.runtime.logs import configure_logging
from services.sandbox_broker.fakes.connect import STREAM_CONTENT_TYPE, end_stream, envelope, first_message
from services.sandbox_broker.fakes.e2b_state import FakeE2BState, FakeSandbox

log = logging.getLogger(__name__)


def create_fake_e2b(state: FakeE2BState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(title="fake e2b", lifespan=lifespan)
    _lifecycle_routes(app, state)
    _envd_routes(app, state)
    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _lifecycle_routes(app: FastAPI, state: FakeE2BState) -> None:
    @app.post("/v2/sandboxes")
    async def create(request: Request) -> Response:
        if not request.headers.get("x-api-key"):
            return _error(401, "missing API key")
        body = await request.json()
        refused = state.admit_create()
        if refused:
            state.rate_limited += 1
            return _error(429, refused)
        egress = bool(body.get("allow_internet_access", True))
        timeout_s = float(body.get("timeout", 300))
        sandbox = await state.create(body.get("templateID", "base"), timeout_s, body.get("metadata") or {}, egress)
        return JSONResponse(sandbox.created(), status_code=201)

    @app.get("/v2/sandboxes")
    async def list_(metadata: str = "") -> JSONResponse:
        query = dict(urllib.parse.parse_qsl(metadata))
        return JSONResponse([s.listed() for s in state.matching(query)])

    @app.post("/v2/sandboxes/{sandbox_id}/connect")
    async def connect(sandbox_id: str, request: Request) -> Response:
        body = await request.json()
        if not state.set_timeout(sandbox_id, float(body.get("timeout", 300))):
            return _error(404, f"sandbox {sandbox_id} not found")
        return JSONResponse(state.sandboxes[sandbox_id].created(), status_code=200)

    @app.post("/sandboxes/{sandbox_id}/timeout")
    async def timeout(sandbox_id: str, request: Request) -> Response:
        body = await request.json()
        if not state.set_timeout(sandbox_id, float(body["timeout"])):
            return _error(404, f"sandbox {sandbox_id} not found")
        return Response(status_code=204)

    @app.delete("/sandboxes/{sandbox_id}")
    async def kill(sandbox_id: str) -> Response:
        return Response(status_code=204) if await state.kill(sandbox_id) else _error(404, "sandbox not found")

    @app.post("/_fake/faults")
    async def faults(request: Request) -> dict[str, int]:
        for name, value in (await request.json()).items():
            setattr(state.faults, name, int(value))
        return {"creates": state.creates, "rate_limited": state.rate_limited, "alive": len(state.sandboxes)}

    @app.get("/_fake/stats")
    async def stats() -> dict[str, int]:
        return {"creates": state.creates, "rate_limited": state.rate_limited, "alive": len(state.sandboxes)}


def _sandbox(state: FakeE2BState, request: Request) -> FakeSandbox | Response:
    """The sandbox an envd request is for, or the 502 E2B's proxy answers with."""
    sandbox_id = request.headers.get("e2b-sandbox-id", "")
    if state.faults.envd_502 > 0:
        state.faults.envd_502 -= 1
        return _bad_gateway(f"The sandbox {sandbox_id} port is not open")
    sandbox = state.sandboxes.get(sandbox_id)
    if sandbox is None:
        return _bad_gateway(f"The sandbox {sandbox_id} was not found")
    return sandbox


def _bad_gateway(message: str) -> Response:
    return JSONResponse({"code": 502, "message": message, "sandboxId": ""}, status_code=502)


def _envd_routes(app: FastAPI, state: FakeE2BState) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        found = _sandbox(state, request)
        return found if isinstance(found, Response) else Response(status_code=204)

    @app.post("/process.Process/Start")
    async def start(request: Request) -> Response:
        found = _sandbox(state, request)
        if isinstance(found, Response):
            return found
        message = first_message(await request.body())
        process = message.get("process", {})
        timeout_ms = int(request.headers.get("connect-timeout-ms", "0") or 0)
        exec_request = ExecRequest(argv=[process.get("cmd", "/bin/bash"), *process.get("args", [])],
                                   env=process.get("envs") or {}, cwd=process.get("cwd") or None,
                                   timeout_s=timeout_ms / 1000 if timeout_ms else 86_400)  # fmt: skip
        events = _run(state, found, exec_request)
        return StreamingResponse(events, media_type=STREAM_CONTENT_TYPE)

    @app.post("/process.Process/SendSignal")
    async def signal(request: Request) -> Response:
        found = _sandbox(state, request)
        if isinstance(found, Response):
            return found
        pid = int((await request.json()).get("process", {}).get("pid", 0))
        task = found.processes.get(pid)
        if task is None:
            return JSONResponse({"code": "not_found", "message": f"process {pid} not found"}, status_code=404)
        task.cancel()
        return JSONResponse({})

    @app.get("/files")
    async def read(request: Request, path: str) -> Response:
        found = _sandbox(state, request)
        if isinstance(found, Response):
            return found
        try:
            return Response(await state.local.read_file(found.local_id, path), media_type="application/octet-stream")
        except PlatformError as exc:
            return _error(404 if exc.status == 404 else 400, exc.message)

    @app.post("/files")
    async def write(request: Request, path: str) -> Response:
        found = _sandbox(state, request)
        if isinstance(found, Response):
            return found
        try:
            await state.local.write_file(found.local_id, path, await request.body())
        except PlatformError as exc:
            return _error(400, exc.message)
        return JSONResponse([{"name": Path(path).name, "type": "file", "path": path}])


async def _run(state: FakeE2BState, sandbox: FakeSandbox, request: ExecRequest) -> AsyncIterator[bytes]:
    """Start, data and end events of one process as Connect envelopes."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def sink(stream: str, data: bytes) -> None:
        queue.put_nowait(envelope({"event": {"data": {stream: base64.b64encode(data).decode()}}}))

    async def run() -> None:
        try:
            result = await state.local.exec(sandbox.local_id, request, sink)
            if result.timed_out:
                queue.put_nowait(end_stream({"code": "deadline_exceeded", "message": "command timed out"}))
            else:
                end = {"exitCode": result.exit_code, "exited": True, "status": f"exit status {result.exit_code}"}
                queue.put_nowait(envelope({"event": {"end": end}}) + end_stream())
        except asyncio.CancelledError:
            queue.put_nowait(envelope({"event": {"end": {"exitCode": -1, "exited": False, "status": "signal: killed",
                                                         "error": "signal: killed"}}}) + end_stream())  # fmt: skip
        finally:
            queue.put_nowait(None)
            sandbox.processes.pop(pid, None)

    pid = sandbox.next_pid = sandbox.next_pid + 1
    task = asyncio.get_running_loop().create_task(run())
    sandbox.processes[pid] = task
    try:
        yield envelope({"event": {"start": {"pid": pid}}})
        while (chunk := await queue.get()) is not None:
            yield chunk
    finally:
        if not task.done():  # the client went away: envd kills the process
            task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description="a local fake of E2B's API and envd")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--create-rate", type=float, default=0.0, help="creates per second before 429 (0: no limit)")
    parser.add_argument("--max-concurrent", type=int, default=100)
    args = parser.parse_args()
    configure_logging()
    state = FakeE2BState(args.state_dir, args.create_rate, args.max_concurrent)
    uvicorn.run(create_fake_e2b(state), host="127.0.0.1", port=args.port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()

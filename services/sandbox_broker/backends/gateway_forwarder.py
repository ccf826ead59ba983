"""The per-lease gateway forwarder of local sandboxes: an HTTP server on a Unix socket in the
sandbox's ``gateway`` directory (bound read-only at ``/run/rollout`` inside it) that relays
``/e/{session}/...`` of the lease's own gateway session to the proxy, and refuses everything else
(403). The socket is the sandbox's only way out: it stays ``network: "none"``, and nothing else of
the host (its loopback, the broker, Redis, the proxy's other routes, another session) is reachable.

It lives in the broker process that bound it, until the sandbox is destroyed or its TTL (the
episode's wall clock plus a grace) passes, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from pathlib import Path

import aiohttp
from aiohttp import web
from yarl import URL

log = logging.getLogger(__name__)

SOCKET_NAME = "gateway.sock"
MAX_BODY = 64 * 2**20  # one call's request body (a long conversation is a few MiB)
# hop-by-hop headers (RFC 9110 7.6.1) and the ones the two HTTP stacks set for themselves
_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                      "upgrade", "host", "content-length"})  # fmt: skip
# no '.', '..', empty or %-encoded segments; ':' within one (Gemini's ``models/{m}:generateContent``)
_SEGMENT = re.compile(r"^[A-Za-z0-9_~-][A-Za-z0-9._~:-]*$")


def allowed(raw_path: str, session: str, root: str = "e") -> bool:
    """Whether a request target (path and query, as sent) is within ``/{root}/{session}/`` (``/e/{session}/``,
    or ``/leases/{task lease}/`` for a paired agent's sandbox)."""
    path = raw_path.partition("?")[0]
    prefix = f"/{root}/{session}/"
    if not path.startswith(prefix):
        return False
    rest = path[len(prefix) :]
    return all(_SEGMENT.match(part) for part in rest.split("/")) if rest else False


class GatewayForwarder:
    def __init__(self, directory: Path, session: str, upstream: str, http: aiohttp.ClientSession) -> None:
        self.directory = directory
        self.session = session
        self.upstream = upstream.rstrip("/")
        self.http = http
        self.runner: web.AppRunner | None = None
        self.expiry: asyncio.TimerHandle | None = None
        self.task: tuple[str, str] | None = None  # a paired agent's: (the task's lease id, the broker's URL)

    async def start(self, ttl_s: float) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        await web.SockSite(self.runner, bound_socket(self.directory)).start()
        loop = asyncio.get_running_loop()
        self.expiry = loop.call_later(ttl_s, lambda: loop.create_task(self.close()))

    async def close(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(OSError):
            (self.directory / SOCKET_NAME).unlink()

    def _upstream_of(self, raw_path: str) -> str | None:
        if allowed(raw_path, self.session):
            return self.upstream
        if self.task is not None and allowed(raw_path, self.task[0], "leases"):
            return self.task[1]  # the broker checks the agent's lease token: exec and files of that lease only
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        upstream_url = self._upstream_of(request.raw_path)
        if upstream_url is None:
            return web.json_response({"error": {"code": "forbidden", "message": "only this sandbox's own gateway "
                                                "session is reachable here", "infra": False}}, status=403)  # fmt: skip
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        target = URL(upstream_url + request.raw_path, encoded=True)
        try:
            async with self.http.request(request.method, target, data=body, headers=headers) as upstream:
                answer = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                answer.headers.update({k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED})
                await answer.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer
        except aiohttp.ClientError as exc:
            log.warning("gateway forwarder of session %s: the proxy failed: %r", self.session, exc)
            return web.json_response({"error": {"code": "transport_error", "message": "the gateway is unreachable",
                                                "infra": True}}, status=502)  # fmt: skip


def bound_socket(directory: Path) -> socket.socket:
    """A listening Unix socket at ``directory/gateway.sock``, any user may connect (the sandbox's uid);
    bound through ``/proc/self/fd`` so that a long state directory never hits the 108-byte limit."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        path = f"/proc/self/fd/{fd}/{SOCKET_NAME}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.listen(1024)
        sock.setblocking(False)
        return sock
    finally:
        os.close(fd)


def client() -> aiohttp.ClientSession:
    """The forwarders' client of the proxy: no connection cap, bodies passed on as they are."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))  # fmt: skip


class GatewayForwarders:
    """The forwarders of one backend's sandboxes, by sandbox id (at most one each: a new binding
    replaces the old one)."""

    def __init__(self) -> None:
        self.open: dict[str, GatewayForwarder] = {}
        self._http: aiohttp.ClientSession | None = None

    async def bind(self, sandbox_id: str, directory: Path, session: str, upstream: str, ttl_s: float) -> None:
        await self.unbind(sandbox_id)
        if self._http is None:
            self._http = client()
        forwarder = GatewayForwarder(directory, session, upstream, self._http)
        await forwarder.start(ttl_s)
        self.open[sandbox_id] = forwarder

    def route_task(self, sandbox_id: str, task_lease: str, broker: str) -> None:
        """Also relay ``/leases/{task_lease}/...`` of the sandbox's (bound) forwarder to ``broker``."""
        self.open[sandbox_id].task = (task_lease, broker.rstrip("/"))

    async def unbind(self, sandbox_id: str) -> None:
        forwarder = self.open.pop(sandbox_id, None)
        if forwarder is not None:
            await forwarder.close()

    async def close(self) -> None:
        for sandbox_id in list(self.open):
            await self.unbind(sandbox_id)
        if self._http is not None:
            await self._http.close()


RELAY_SOURCE = (Path(__file__).parent / "gateway_relay.py").read_text()


def relay_command(python: str, port: int, socket_path: str, command: list[str]) -> list[str]:
    """The command behind the in-sandbox relay (``gateway_relay.py``) listening on ``port``."""
    return [python, "-I", "-S", "-c", RELAY_SOURCE, str(port), socket_path, *command]

"""The proxy's listening socket: data-plane calls served without aiohttp's request objects.

Nearly every request a proxy serves is ``POST /generate`` (or an OpenAI route) with a
``Content-Length`` body and a JSON answer. Through aiohttp's server each one paid for its
``RequestHandler`` loop, a ``BaseRequest`` (a ``yarl`` URL, a multidict of headers, a payload
stream), a ``Response`` prepared and written by its ``StreamWriter``: 0.12-0.15 ms of CPU per
request where a protocol of its own takes about 0.055, when requests come one per wake-up (figures
in ``docs/llm_proxy.md``). :class:`LeanConnection` reads such a call itself and gives it to
:meth:`DataPlane.serve` (the same authentication, forwarder and error bodies as through aiohttp),
then writes the answer's status, headers and body in one write.

The agent gateway's non-streaming calls (``POST /e/{session}/v1/chat/completions``, ``completions``,
``messages``, ``responses``, without a query string) are read the same way and given to the
application's own gateway handlers, with the ``ErrorBody`` answer of an unhandled error as its
``error_bodies`` middleware gives it (the gateway checks its session's token itself).

It takes only what it can read without doubt: ``POST`` to one of those routes, ``HTTP/1.1``,
well-formed header lines, names seen once, one ``Content-Length`` of digits within
``max_body_bytes``, no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, and a body without
``"stream"`` or a ``\\u00`` escape (``"\\u0073tream"`` is the same key). At the first request that
is anything else the connection is handed, with the request's bytes still unread, to aiohttp's
``RequestHandler`` for the rest of its life: the application's routes, streams, chunked bodies,
413s and malformed requests are aiohttp's as before.

Pipelined calls are served one after another, in order; none while the client leaves earlier
answers unread (the transport's buffer past its high-water mark). Slow clients are cut as on
aiohttp's connections (``client_limits.py``): a request's headers due ``http_header_timeout_s``
after its first byte (the first request's after the connection opened), its body
``http_body_timeout_s`` after its headers; an idle connection is closed after
``http_keepalive_s``. A connection that goes away cancels its call (the forwarder aborts the
engine's request), as aiohttp's ``handler_cancellation`` does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from types import MappingProxyType
from typing import Any, cast

from aiohttp import web

from services.llm_proxy.client_limits import ClientGuard
from services.llm_proxy.data_plane import ROUTES, DataPlane
from services.llm_proxy.errors import answer_error
from services.llm_proxy.limits import MAX_HEADERS  # aiohttp's limit: a head with more goes to it, to be refused
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.responses import error_response
from services.protocol import ErrorCode, PlatformError

log = logging.getLogger(__name__)

_REQUEST_LINE = re.compile(
    rb"POST (/generate|/v1/chat/completions|/v1/completions"
    rb"|/e/([0-9A-Za-z_-]{1,128})(/v1/(?:chat/completions|completions|messages|responses))) HTTP/1\.1"
)  # the data plane's routes, and the agent gateway's (``gateway/service.py``) without a query string
GATEWAY_ROUTE = "/e/{session}"  # a gateway route's pattern in the application: this, then the suffix
_NO_QUERY: Mapping[str, str] = MappingProxyType({})
# a header line: a token, a colon, a value of visible characters, spaces and tabs (no obs-fold)
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_HANDED_HEADERS = frozenset({"transfer-encoding", "expect", "upgrade"})
MAX_HEAD_BYTES = 16384  # a longer head goes to aiohttp, which applies its own line and field limits
PIPELINED_MAX_BYTES = 1 << 20  # read no further while a call is served and this much waits behind it
_SKIP_ANSWER_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "date"})

assert all(_REQUEST_LINE.fullmatch(b"POST %s HTTP/1.1" % r.encode()) for r in ROUTES)


class LeanHeaders(dict[str, str]):
    """Header names in lower case; ``get`` takes a name in any case, as aiohttp's headers do."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)


class LeanRequest:
    """A call read whole by :class:`LeanConnection`: what ``CallRequest`` asks for, and for a gateway
    call what the gateway's handlers read of aiohttp's request (``match_info``, ``query``, ``transport``)."""

    __slots__ = ("body", "headers", "match_info", "method", "path", "query", "route", "transport")

    def __init__(self, path: str, headers: LeanHeaders, body: bytes, gateway: tuple[str, str] | None = None) -> None:
        self.method = "POST"
        self.path = path
        self.headers = headers
        self.body = body
        self.query = _NO_QUERY
        self.transport: asyncio.Transport | None = None
        # a gateway call: its session, and its route as the application names it
        self.match_info = {"session": gateway[0]} if gateway else {}
        self.route = GATEWAY_ROUTE + gateway[1] if gateway else None

    async def read(self) -> bytes:
        return self.body


Head = tuple[str, LeanHeaders, int, bool, tuple[str, str] | None]


def parse_head(head: bytes) -> Head | None:
    """``(path, headers, content length, close after the answer, (session, route) of a gateway call)``
    of a request this server takes, None for any other (aiohttp's then)."""
    lines = head.split(b"\r\n")
    found = _REQUEST_LINE.fullmatch(lines[0])
    if found is None or len(lines) > MAX_HEADERS + 1:
        return None
    headers = LeanHeaders()
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            return None
        headers[field[1].decode("ascii").lower()] = field[2].decode("latin-1")
    length = headers.get("content-length")
    if len(headers) != len(lines) - 1 or length is None or not length.isdigit() or not length.isascii():
        return None  # a name seen twice, no length, or not one of digits
    if not _HANDED_HEADERS.isdisjoint(headers):
        return None
    connection = headers.get("connection", "keep-alive").lower()
    if connection not in ("keep-alive", "close"):
        return None
    gateway = (found[2].decode("ascii"), found[3].decode("ascii")) if found[2] else None
    return found[1].decode("ascii"), headers, int(length), connection == "close", gateway


class _Date:
    """The ``Date`` header's value, formatted once a second."""

    def __init__(self) -> None:
        self.second = 0
        self.value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self.second:
            self.second, self.value = second, formatdate(second, usegmt=True).encode("ascii")
        return self.value


_DATE = _Date()


def answer_bytes(response: web.StreamResponse, close: bool) -> bytes:
    """The whole answer to write: status line, the response's headers, its length and its body.
    Raises ``ValueError`` for a header value with a line break (aiohttp refuses those too)."""
    body = cast(web.Response, response).body
    if not isinstance(body, bytes):
        raise TypeError(f"the lean server writes whole bodies, not {type(body).__name__}")
    head = [b"HTTP/1.1 %d %s\r\nDate: %s\r\n" % (response.status, response.reason.encode("latin-1"), _DATE.now())]
    for name, value in response.headers.items():
        if name.lower() not in _SKIP_ANSWER_HEADERS:
            if "\r" in value or "\n" in value:
                raise ValueError(f"a line break in the value of header {name}")
            head.append(b"%s: %s\r\n" % (name.encode("utf-8"), value.encode("utf-8")))
    head.append(b"Content-Length: %d\r\n%s\r\n" % (len(body), b"Connection: close\r\n" if close else b""))
    return b"".join(head) + body


class LeanServer:
    """The connection factory of one proxy process's socket, and what its connections share."""

    def __init__(
        self, aiohttp_server: web.Server, plane: DataPlane, guard: ClientGuard, metrics: ProxyMetrics,
        max_body_bytes: int,
    ) -> None:  # fmt: skip
        self.aiohttp_server = aiohttp_server
        self.plane = plane
        self.guard = guard
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.connections: set[LeanConnection] = set()
        self.gateway: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {}  # by route pattern

    def __call__(self) -> LeanConnection:
        return LeanConnection(self)

    def gateway_from(self, app: web.Application) -> None:
        """Serve the agent gateway's routes that this protocol reads with the application's own handlers
        (``gateway/service.py``: they check the session's token themselves)."""
        for resource in app.router.resources():
            for route in resource:
                if route.method == "POST" and resource.canonical.startswith(GATEWAY_ROUTE + "/"):
                    self.gateway[resource.canonical] = route.handler

    async def answer(self, request: LeanRequest) -> web.StreamResponse:
        if request.route is None:
            return await self.plane.serve(request)
        handler = self.gateway.get(request.route)
        if handler is None:  # no gateway in this application
            return error_response(PlatformError(ErrorCode.NOT_FOUND, f"no route {request.path}"))
        try:
            return await handler(cast(web.Request, request))  # reads only what LeanRequest has
        except Exception as exc:  # the ``error_bodies`` middleware, as on the application's routes
            return answer_error(request, exc)

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections now, give calls in progress ``timeout_s``, then cancel them."""
        for connection in list(self.connections):
            if connection.task is None:
                connection.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for connection in list(self.connections):
            connection.close()


class LeanConnection(asyncio.Protocol):
    """One client connection, served here while its requests are plain data-plane calls."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.waiting: str | None = "header"  # the part of a request whose deadline is armed
        self.paused = False  # reading paused: pipelined calls wait behind the one being served
        self.head: tuple[int, Head] | None = None  # the buffered request's head, once read: (its end, it)
        self.blocked = False  # the client reads its answers slower than it sends calls: none served meanwhile

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        self.server.guard.track(self, self.transport)  # the first request's headers are due

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.connections.discard(self)
        self.server.guard.forget(self)
        if self.task is not None:
            self.task.cancel()  # the forwarder aborts the engine's request

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.task is None and not self.blocked:
            self._next()
        elif len(self.buffer) > PIPELINED_MAX_BYTES and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True

    def pause_writing(self) -> None:
        self.blocked = True  # the transport's buffer of unread answers passed its high-water mark

    def resume_writing(self) -> None:
        self.blocked = False
        if self.task is None and self.transport is not None:
            self._resume()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _next(self) -> None:
        """Start serving the buffered request once it is whole; arm the deadline of what is missing."""
        buffer, guard = self.buffer, self.server.guard
        if not buffer:
            return
        if self.head is None:  # read once per request, not again for each piece of its body
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self._hand_over()
                elif self.waiting is None:
                    self.waiting = "header"
                    guard.waiting(self, "header")
                return
            parsed = parse_head(bytes(buffer[:end]))
            if parsed is None or parsed[2] > self.server.max_body_bytes:
                self._hand_over()
                return
            self.head = end, parsed
        end, (path, headers, length, close, gateway) = self.head
        whole = end + 4 + length
        if len(buffer) < whole:
            if self.waiting != "body":
                self.waiting = "body"
                guard.waiting(self, "body")
            return
        self.head = None
        with memoryview(buffer) as view:
            body = bytes(view[end + 4 : whole])
        if b'"stream"' in body or b"\\u00" in body:
            self._hand_over()  # an SSE answer is aiohttp's to write (a key may be spelt with escapes)
            return
        del buffer[:whole]
        self.waiting = None
        guard.disarm(self)
        request = LeanRequest(path, headers, body, gateway)
        request.transport = self.transport
        self.task = asyncio.get_running_loop().create_task(self._serve(request, close))

    async def _serve(self, request: LeanRequest, close: bool) -> None:
        try:
            response = await self.server.answer(request)  # every error is answered there
            answer = answer_bytes(response, close)
            self.server.metrics.tally.count(self.server.metrics.lean_calls)
        except Exception:  # an answer this protocol cannot write: never leave the client waiting
            log.exception("lean server: no answer to write for %s; closing the connection", request.path)
            answer, close = b"", True
        finally:
            self.task = None
        if self.transport is not None:
            self.transport.write(answer)
        if close:
            self.close()
            return
        if self.transport is None:
            return
        self.server.guard.idle(self)
        if not self.blocked:
            self._resume()

    def _resume(self) -> None:
        """Serve what came behind the last call (pipelined), and read on."""
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self._next()

    def _hand_over(self) -> None:
        """Give this connection, with what it has read, to aiohttp's ``RequestHandler`` for good."""
        transport = self.transport
        if transport is None:
            return
        self.transport = None
        self.server.connections.discard(self)
        self.server.guard.forget(self)
        self.server.metrics.handed_over.inc()
        if self.paused:
            transport.resume_reading()
        handler = cast(Callable[[], asyncio.Protocol], self.server.aiohttp_server)()
        transport.set_protocol(handler)
        handler.connection_made(transport)  # the guard follows it from here, as any aiohttp connection
        if self.buffer:
            handler.data_received(bytes(self.buffer))
        self.buffer = bytearray()

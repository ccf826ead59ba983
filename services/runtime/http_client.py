"""A lean HTTP/1.1 client for the hot calls between the platform's own services (a worker's
``/generate`` to the proxy and ``/exec`` to the broker: two per agent turn).

aiohttp's client spends about 0.35 ms of CPU per request on its request and response objects,
multidicts, timers, tracing and cookie hooks; the same keep-alive exchange parsed with httptools
(llhttp, the parser aiohttp's own C extension and uvicorn use) costs under 0.1 ms (``rollout bench
turn``, ``http_client``). This client does only what these calls need: requests with a whole body
(``Content-Length``), answers with ``Content-Length`` or chunked bodies, keep-alive, TLS for an
``https`` origin. There is no connection cap: a request takes an idle connection or opens one, so
as many connections are open as requests are in flight. Idle ones are closed after ``idle_s``,
below the servers' own keep-alive, so a request never goes out on a socket the server is closing.

Failures keep aiohttp's split, which the callers rely on: :class:`ConnectFailed` means the request
never left (safe to send again), :class:`ConnectTimeout` when opening the connection took longer
than ``connect_timeout_s`` (a busy server, not a down one); :class:`Disconnected` means the
connection ended after it was sent and before the whole answer came (the server may have acted on
it), :class:`ClosedBeforeAnswer` when not one byte of the answer had come (aiohttp's
``ServerDisconnectedError``: a server closing a keep-alive socket, or a process that died); a
deadline is ``TimeoutError``. A connection is reused only after a complete answer that allows
keep-alive.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_S = 4.0  # below the 5 s keep-alive of SGLang-style servers, far below the broker's and proxy's


class ConnectFailed(ConnectionError):
    """No connection to the origin: the request was not sent."""


class ConnectTimeout(ConnectFailed):
    """Opening the connection took longer than the client's ``connect_timeout_s``."""


class Disconnected(ConnectionError):
    """The connection ended (or the answer was malformed) after the request was sent."""


class ClosedBeforeAnswer(Disconnected):
    """The connection ended after the request was sent and before any byte of the answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class _Connection(asyncio.Protocol):
    """One socket and its response parser; one exchange at a time."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.open = False
        self.answering = False  # a byte of the current exchange's answer has come
        self.last_used = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.open = True

    def data_received(self, data: bytes) -> None:
        self.answering = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Disconnected(f"malformed answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.answering:
            self._fail(Disconnected(f"connection closed before the whole answer came ({exc!r})"))
        else:
            self._fail(ClosedBeforeAnswer(f"connection closed before the answer ({exc!r})"))

    # -- httptools callbacks -----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        answer = Answer(self.parser.get_status_code(), self.headers, b"".join(self.chunks))
        self.headers, self.chunks = {}, []
        if not self.parser.should_keep_alive():
            self.close()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # -- use -----------------------------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.answering = False
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class HttpClient:
    """Keep-alive connections to one origin (``http://host:port`` or ``https://...``)."""

    def __init__(self, url: str, *, idle_s: float = IDLE_S, connect_timeout_s: float | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {url!r}")
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self._host_header = parts.netloc.encode("latin-1")
        self._idle: list[_Connection] = []  # oldest first
        self._busy: set[_Connection] = set()

    @property
    def connections(self) -> int:
        """Open connections, in use and idle."""
        return len(self._busy) + len(self._idle)

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Answer:  # fmt: skip
        """One exchange; ``target`` is the path with its query (``/leases/x/exec``)."""
        head = [b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (
            method.encode("ascii"), target.encode("latin-1"), self._host_header, len(body))]  # fmt: skip
        for name, value in (headers or {}).items():
            head.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        head.append(b"\r\n")
        async with asyncio.timeout(timeout_s):
            connection = await self._take()
            try:
                answer = await connection.send(b"".join(head) + body)
            except BaseException:  # cut off or cancelled mid-exchange: the socket cannot be reused
                connection.close()
                self._busy.discard(connection)
                raise
        self._give_back(connection)
        return answer

    async def close(self) -> None:
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()

    async def _take(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()  # the most recently used: the least likely to be closing
            if connection.open and now - connection.last_used < self.idle_s:
                self._busy.add(connection)
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s) as connecting:
                _, connection = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None
                )
        except TimeoutError as exc:
            if connecting.expired():  # this timeout, not the caller's deadline around the request
                raise ConnectTimeout(f"{self.url}: no connection within {self.connect_timeout_s:g} s") from exc
            raise
        except OSError as exc:  # refused, unreachable, no such host, TLS handshake failed
            raise ConnectFailed(f"{self.url}: {exc!r}") from exc
        self._busy.add(connection)
        return connection

    def _give_back(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        now = time.monotonic()
        while self._idle and now - self._idle[0].last_used >= self.idle_s:  # expired: close them now
            self._idle.pop(0).close()
        if connection.open:
            connection.last_used = now
            self._idle.append(connection)

"""The upstream HTTP clients: one aiohttp session per process (streams, control calls) and a lean
client per engine for the non-streaming calls (:class:`EngineLinks`), no connection cap on either.

httpx's pool is O(n^2) in calls in flight and both libraries default to 100 connections, the
hidden cap seen in the field; aiohttp with ``limit=0`` handles thousands in flight. The idle
keep-alive stays below SGLang's 5 s so the client never reuses a socket the server is closing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohappyeyeballs import AddrInfoType
from aiohttp.client_exceptions import ClientConnectorError
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.helpers import ceil_timeout
from yarl import URL

from services.llm_proxy.settings import ProxySettings
from services.runtime.http_client import ClosedBeforeAnswer, ConnectFailed, ConnectTimeout, HttpClient

log = logging.getLogger(__name__)

JSON_HEADERS = {"Content-Type": "application/json"}

# raised before a response arrived: the call may be retried on another engine
NOT_ANSWERED = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class NotAnswered(Exception):
    """The engine gave no answer (refused, reset, disconnected): the call may go elsewhere."""


class SlowConnect(Exception):
    """Opening the connection took longer than ``connect_timeout_s``: the engine is busy, not down.
    The call is tried again (another engine or the same) within its own deadline, never failed."""


async def post(client: HttpClient, route: str, payload: bytes) -> tuple[int, bytes]:
    """A non-streaming call over an engine's lean client: ``(status, body)``; the same failure split
    as :func:`post_streaming`."""
    try:
        answer = await client.request("POST", route, payload, JSON_HEADERS)
    except ConnectTimeout as exc:
        raise SlowConnect(str(exc)) from exc
    except (ConnectFailed, ClosedBeforeAnswer) as exc:
        raise NotAnswered(f"{type(exc).__name__}: {exc}") from exc
    return answer.status, answer.body


async def post_streaming(session: aiohttp.ClientSession, url: URL, payload: bytes) -> aiohttp.ClientResponse:
    """A call whose answer is read as it comes (a stream), over the aiohttp session."""
    try:
        return await session.post(url, data=payload, headers=JSON_HEADERS)
    except aiohttp.ConnectionTimeoutError as exc:  # a TimeoutError too: must not look like the deadline
        raise SlowConnect(str(exc)) from exc
    except NOT_ANSWERED as exc:
        raise NotAnswered(f"{type(exc).__name__}: {exc}") from exc


class EngineConnector(aiohttp.TCPConnector):
    """``TCPConnector`` that opens a plain connection to a single resolved address in one call.

    Engines are reached by one address each (an IP, or a name that resolves to one), without TLS,
    so happy eyeballs has nothing to race: its socket set-up in Python was the largest part of
    opening a connection (a third of it), and a burst of calls opens one per call. The loop
    creates and connects the socket itself; the timeout and the errors are aiohttp's own, so a
    slow connect still surfaces as ``ConnectionTimeoutError``. Anything else (several addresses,
    TLS) goes through aiohttp unchanged.
    """

    async def _wrap_create_connection(  # type: ignore[override]
        self,
        factory: Callable[[], ResponseHandler],
        *,
        addr_infos: list[AddrInfoType],
        req: ClientRequest,
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp calls it with this name)
        client_error: type[Exception] = ClientConnectorError,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        if len(addr_infos) != 1 or kwargs.get("ssl") or self._local_addr_infos:
            return await super()._wrap_create_connection(
                factory, addr_infos=addr_infos, req=req, timeout=timeout, client_error=client_error, **kwargs
            )
        family, _, _, _, address = addr_infos[0]
        try:
            async with ceil_timeout(timeout.sock_connect, ceil_threshold=timeout.ceil_threshold):
                return await self._loop.create_connection(factory, str(address[0]), int(address[1]), family=family)
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise  # the connect timeout: aiohttp reports it as ConnectionTimeoutError
            raise client_error(req.connection_key, exc) from exc


def create_session(settings: ProxySettings) -> aiohttp.ClientSession:
    connector = EngineConnector(limit=0, limit_per_host=0, keepalive_timeout=settings.keepalive_s, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
    jar = aiohttp.DummyCookieJar()  # engines set no cookies; skip the jar's per-call work
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False, cookie_jar=jar)


class EngineLinks:
    """The non-streaming calls' transport: a lean keep-alive client per engine
    (``services.runtime.http_client``: httptools' parser, no cap, no per-request objects; about a
    fifth of aiohttp's client CPU per call). Streaming calls and control calls stay on aiohttp.
    Idle connections close after ``keepalive_s``, below SGLang's 5 s, as aiohttp's do."""

    def __init__(self, settings: ProxySettings) -> None:
        self.keepalive_s = settings.keepalive_s
        self.connect_timeout_s = settings.connect_timeout_s
        self._clients: dict[str, HttpClient] = {}

    def to(self, url: str) -> HttpClient:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = HttpClient(
                url, idle_s=self.keepalive_s, connect_timeout_s=self.connect_timeout_s
            )
        return client

    @property
    def connections(self) -> int:
        return sum(c.connections for c in self._clients.values())

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


def open_connections(session: aiohttp.ClientSession) -> int:
    """Connections the session holds (in use + idle); aiohttp exposes no public counter."""
    connector = session.connector
    if connector is None:
        return 0
    acquired = len(getattr(connector, "_acquired", ()))
    idle = sum(len(v) for v in getattr(connector, "_conns", {}).values())
    return acquired + idle


class EngineClient:
    """Control-plane calls to one engine at a time (JSON in, status + JSON out)."""

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def call(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """``(status, parsed JSON or text)``; transport failures come back as status 0 and the error text."""
        data = None if body is None else orjson.dumps(body)
        try:
            async with self.session.request(method, url, data=data, headers=JSON_HEADERS, timeout=self.timeout) as resp:
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        try:
            return resp.status, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return resp.status, raw.decode(errors="replace")

    async def abort(self, engine_url: str, rid: str) -> None:
        status, detail = await self.call("POST", engine_url + "/abort_request", {"rid": rid})
        if status != 200:
            log.warning("abort of %s on %s failed: %s %s", rid, engine_url, status, detail)


class BackgroundTasks:
    """Fire-and-forget work (aborts, counters) that must outlive a cancelled handler."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task failed: %r", task.exception())

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def engine_message(raw: bytes) -> str:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")[:2000]
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in doc:
            return str(doc["message"])
    return str(doc)[:2000]


def token_counts(doc: Any) -> tuple[int, int]:
    if not isinstance(doc, dict):
        return 0, 0
    meta = doc.get("meta_info") or doc.get("usage") or {}
    if not isinstance(meta, dict):
        return 0, 0
    return int(meta.get("prompt_tokens") or 0), int(meta.get("completion_tokens") or 0)

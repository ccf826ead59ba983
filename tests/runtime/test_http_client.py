"""The lean keep-alive client (``services.runtime.http_client``) against real servers on loopback:
reuse, answers of every framing our servers send, and the split between a request that never left
(``ConnectFailed``; ``ConnectTimeout`` for one that did not connect in time), one cut off after it
was sent (``Disconnected``; ``ClosedBeforeAnswer`` when no byte of the answer came) and a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from services.runtime.http_client import (
    ClosedBeforeAnswer,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    HttpClient,
)
from services.runtime.net import free_port
from tests.support.http import serving


def peers() -> tuple[set[object], web.RouteDef]:
    """A route that records the client's port of each request (one port = one connection)."""
    seen: set[object] = set()

    async def echo(request: web.Request) -> web.Response:
        seen.add(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.read()
        return web.Response(body=body, headers={"X-Weight-Version": "v7"})

    return seen, web.post("/echo", echo)


async def test_connections_are_kept_alive_and_answers_come_whole() -> None:
    seen, route = peers()
    async with serving(route) as url:
        client = HttpClient(url)
        for i in range(20):
            answer = await client.request("POST", "/echo", b"x" * i * 1000, {"Content-Type": "text/plain"})
            assert answer.status == 200 and answer.body == b"x" * i * 1000
        assert answer.headers["x-weight-version"] == "v7"  # names in lower case
        assert len(seen) == 1 and client.connections == 1
        await client.close()


def test_the_same_on_uvloop() -> None:
    """The services run uvloop, whose transports are not asyncio's classes."""
    import uvloop

    uvloop.run(test_connections_are_kept_alive_and_answers_come_whole())
    uvloop.run(test_a_connection_cut_after_the_request_is_disconnected(None))


async def test_no_cap_one_connection_per_request_in_flight() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return web.Response(text="ok")

    async with serving(web.get("/slow", slow)) as url:
        client = HttpClient(url)
        answers = await asyncio.gather(*(client.request("GET", "/slow") for _ in range(200)))
        assert all(a.body == b"ok" for a in answers)
        assert client.connections == 200
        await client.close()


async def test_chunked_answers_and_queries() -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (request.query["path"].encode(), b"-", b"end"):
            await response.write(part)
        await response.write_eof()
        return response

    async with serving(web.get("/files", chunked)) as url:
        client = HttpClient(url)
        answer = await client.request("GET", "/files?path=%2Fa%20b")
        assert answer.body == b"/a b-end"
        assert (await client.request("GET", "/files?path=x")).body == b"x-end"  # the same socket, next answer
        assert client.connections == 1
        await client.close()


async def test_a_refused_connect_is_connect_failed() -> None:
    client = HttpClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectFailed):
        await client.request("GET", "/")


@contextlib.asynccontextmanager
async def raw_server(reply: bytes | None) -> AsyncIterator[str]:
    """A server that reads one request, writes ``reply`` (None: nothing) and closes the socket."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if reply is not None:
            writer.write(reply)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "reply", [None, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", b"not http at all\r\n\r\n"]
)
async def test_a_connection_cut_after_the_request_is_disconnected(reply: bytes | None) -> None:
    async with raw_server(reply) as url:
        client = HttpClient(url)
        with pytest.raises(Disconnected) as raised:
            await client.request("POST", "/exec", b"{}")
        assert isinstance(raised.value, ClosedBeforeAnswer) == (reply is None)  # no byte came: before the answer
        assert client.connections == 0


async def test_a_connect_that_hangs_is_a_connect_timeout_not_the_deadline(tarpit: str) -> None:
    client = HttpClient(tarpit, connect_timeout_s=0.2)
    with pytest.raises(ConnectTimeout):
        await client.request("GET", "/", timeout_s=5)
    with pytest.raises(TimeoutError) as raised:  # the request's own deadline first: a deadline
        await client.request("GET", "/", timeout_s=0.1)
    assert not isinstance(raised.value, ConnectFailed)
    assert client.connections == 0


async def test_connection_close_answers_are_not_reused() -> None:
    async with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok") as url:
        client = HttpClient(url)
        assert (await client.request("GET", "/")).body == b"ok"
        assert client.connections == 0
        assert (await client.request("GET", "/")).body == b"ok"  # a new connection, not the closed one


async def test_a_deadline_is_a_timeout_and_drops_the_connection() -> None:
    _, route = peers()

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    async with serving(route, web.get("/hang", hang)) as url:
        client = HttpClient(url)
        with pytest.raises(TimeoutError):
            await client.request("GET", "/hang", timeout_s=0.2)
        assert client.connections == 0
        assert (await client.request("POST", "/echo", b"after")).body == b"after"
        await client.close()


async def test_idle_connections_expire_and_server_closed_ones_are_skipped() -> None:
    seen, route = peers()
    async with serving(route) as url:
        client = HttpClient(url, idle_s=0.2)
        await client.request("POST", "/echo", b"1")
        await asyncio.sleep(0.3)  # past idle_s: the next request opens a new connection
        await client.request("POST", "/echo", b"2")
        assert len(seen) == 2
    await asyncio.sleep(0.05)  # the server has closed its side of the idle connection
    with pytest.raises(ConnectFailed):  # the closed socket is not reused: a fresh connect is refused
        await client.request("POST", "/echo", b"3")
    assert client.connections == 0

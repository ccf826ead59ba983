"""The upstream connector against real sockets on loopback: a single address connects without
happy eyeballs, a refused connect is "not answered" (retried elsewhere), a connect that hangs is
aiohttp's ConnectionTimeoutError (the proxy's slow connect, never a deadline), and connections are
reused while they are kept alive; the non-streaming calls' lean clients (``EngineLinks``) likewise."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohappyeyeballs
import aiohttp
import pytest
from aiohttp import web

from services.llm_proxy.settings import ProxySettings
from services.llm_proxy.upstream import (
    JSON_HEADERS,
    NOT_ANSWERED,
    EngineConnector,
    EngineLinks,
    create_session,
    open_connections,
)
from services.runtime.http_client import ConnectTimeout


@pytest.fixture
async def engine_url() -> AsyncIterator[str]:
    async def answer(request: web.Request) -> web.Response:
        assert request.transport is not None
        return web.json_response({"ok": True, "peer": request.transport.get_extra_info("peername")[1]})

    app = web.Application()
    app.router.add_post("/generate", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture
def session_settings() -> ProxySettings:
    return ProxySettings(allow_anonymous=True, connect_timeout_s=0.3)


@pytest.fixture
def no_happy_eyeballs(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: object, **kwargs: object) -> socket.socket:
        raise AssertionError("a single address went through happy eyeballs")

    monkeypatch.setattr(aiohappyeyeballs, "start_connection", refuse)


async def test_calls_connect_without_happy_eyeballs_and_reuse_the_connection(
    engine_url: str, session_settings: ProxySettings, no_happy_eyeballs: None
) -> None:
    async with create_session(session_settings) as session:
        assert isinstance(session.connector, EngineConnector)
        peers = []
        for _ in range(3):
            async with session.post(engine_url + "/generate", data=b"{}") as resp:
                assert resp.status == 200
                peers.append((await resp.json())["peer"])
        assert len(set(peers)) == 1  # one kept-alive connection served all three
        assert open_connections(session) == 1


async def test_a_refused_connect_is_not_answered(session_settings: ProxySettings) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    async with create_session(session_settings) as session:
        with pytest.raises(NOT_ANSWERED):
            await session.post(f"http://127.0.0.1:{port}/generate", data=b"{}")


async def test_a_hanging_connect_is_a_connection_timeout(session_settings: ProxySettings, tarpit: str) -> None:
    async with create_session(session_settings) as session:
        with pytest.raises(aiohttp.ConnectionTimeoutError):
            await session.post(tarpit + "/generate", data=b"{}")


async def test_engine_links_keep_one_client_per_engine_and_count_its_connections(
    engine_url: str, session_settings: ProxySettings, tarpit: str
) -> None:
    links = EngineLinks(session_settings)
    client = links.to(engine_url)
    assert links.to(engine_url) is client
    answers = await asyncio.gather(*(client.request("POST", "/generate", b"{}", JSON_HEADERS) for _ in range(3)))
    assert [a.status for a in answers] == [200] * 3
    assert links.connections == 3  # one per call in flight, kept alive: no cap
    with pytest.raises(ConnectTimeout):  # the proxy's slow connect (connect_timeout_s), not a deadline
        await links.to(tarpit).request("POST", "/generate", b"{}")
    await links.close()
    assert links.connections == 0

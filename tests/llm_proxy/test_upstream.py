"""The upstream connector against real sockets on loopback: a single address connects without
happy eyeballs, a refused connect is "not answered" (retried elsewhere), a connect that hangs is
aiohttp's ConnectionTimeoutError (the proxy's slow connect, never a deadline), and connections are
reused while they are kept alive."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import aiohappyeyeballs
import aiohttp
import pytest
from aiohttp import web

from services.llm_proxy.settings import ProxySettings
from services.llm_proxy.upstream import NOT_ANSWERED, EngineConnector, create_session, open_connections


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


@pytest.fixture
def tarpit() -> Iterator[str]:
    """A port whose accept queue is full: the kernel drops new SYNs (see test_slow_connect.py)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(2):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(server.getsockname())
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        for sock in (*fillers, server):
            sock.close()


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

"""The pipelined connection (``runtime/redis_pipeline.py``) against a real Redis: replies reach
their callers in order under concurrency, a caller that stops waiting leaves the connection in
step, a lost connection fails what is in flight and the next command opens a new one, a script is
loaded again after a NOSCRIPT, a reply past the timeout fails the connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.runtime.lua import LuaScript
from services.runtime.redis_pipeline import PipelinedRedis, pipelined
from services.runtime.redis_pool import open_redis


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    client = open_redis(redis_url)
    yield client
    await client.aclose(close_connection_pool=True)


@pytest.fixture
async def link(client: Redis) -> AsyncIterator[PipelinedRedis]:
    """A pipelined connection to the embedded server (it has a password: AUTH is sent first)."""
    link = pipelined(client)
    assert link is not None
    yield link
    link.close()
    link.close()  # twice: harmless


ECHO = LuaScript(keys=("key",), args=("value",), body="redis.call('SET', key, value)\nreturn {value, 1}")


async def test_replies_reach_their_callers_in_order_and_scripts_reload(client: Redis, link: PipelinedRedis) -> None:
    replies = await asyncio.gather(*(link.execute("ECHO", f"v{i}") for i in range(500)))
    assert replies == [f"v{i}".encode() for i in range(500)]
    with pytest.raises(ResponseError, match="unknown command"):
        await link.execute("NOSUCHCOMMAND")
    assert await link.execute("PING") == b"PONG"  # an error reply does not put it out of step

    script = ECHO.pipelined(link)
    await client.script_flush()
    assert await script({"key": "k"}, {"value": "x"}) == [b"x", 1]  # NOSCRIPT: loaded, run again
    sent = [script.send({"key": f"k{i}"}, {"value": str(i)}) for i in range(50)]
    assert [(await s)[0] for s in sent] == [str(i).encode() for i in range(50)]
    assert await client.get("k49") == b"49"


async def test_a_caller_that_stops_waiting_leaves_the_connection_in_step(link: PipelinedRedis) -> None:
    await link.execute("PING")
    slow = asyncio.ensure_future(link.execute("BLPOP", "nothing", "0.3"))
    after = link.send("ECHO", "after")
    await asyncio.sleep(0.05)
    slow.cancel()
    assert await after == b"after"  # its reply comes after BLPOP's, which is read and dropped
    assert await link.execute("ECHO", "next") == b"next"


async def test_a_lost_connection_fails_what_is_in_flight_and_the_next_command_reconnects(
    client: Redis, link: PipelinedRedis
) -> None:
    await client.client_setname("admin")
    await link.execute("CLIENT", "SETNAME", "pipelined")
    blocked = link.send("BLPOP", "nothing", "5")
    await asyncio.sleep(0.05)
    await client.client_kill_filter(_type="normal", skipme=True, laddr=None, user=None)
    with pytest.raises(RedisConnectionError):
        await blocked
    assert await link.execute("ECHO", "again") == b"again"


async def test_a_reply_past_the_timeout_fails_the_connection(client: Redis) -> None:
    base = pipelined(client)
    assert base is not None
    link = PipelinedRedis(base.host, base.port, password=base.password, timeout_s=0.2)
    with pytest.raises(RedisTimeoutError):
        await link.execute("BLPOP", "nothing", "2")
    assert await link.execute("ECHO", "fresh") == b"fresh"  # a new connection
    link.close()


def test_a_cluster_tls_or_unix_socket_keeps_the_redis_py_client() -> None:
    assert pipelined(open_redis("rediss://127.0.0.1:6390/0")) is None
    assert pipelined(open_redis("unix:///tmp/none.sock")) is None
    assert pipelined(open_redis("redis+cluster://127.0.0.1:6390")) is None
    link = pipelined(open_redis("redis://:pw@127.0.0.1:6390/3"))
    assert link is not None and (link.port, link.db, link.password) == (6390, 3, "pw")


async def test_a_refused_auth_fails_the_caller_and_leaves_no_connection_open(client: Redis) -> None:
    base = pipelined(client)
    assert base is not None
    link = PipelinedRedis(base.host, base.port, password="not-the-password")
    before = len(await client.client_list())
    for _ in range(5):
        with pytest.raises(ResponseError):
            await link.execute("PING")
    await asyncio.sleep(0.1)
    assert len(await client.client_list()) == before
    link.close()

"""Lua scripts with named KEYS and ARGV, run on a real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio

from services.runtime.lua import LuaScript

COPY = LuaScript(
    keys=("source", "target"),
    args=("field", "suffix"),
    body="""
local value = redis.call('HGET', source, field) .. suffix
redis.call('SET', target, value)
return {value, #ARGV - REST + 1}
""",
)


def test_the_source_names_keys_and_args_first() -> None:
    lines = COPY.source.splitlines()
    assert lines[:3] == ["local source, target = KEYS[1], KEYS[2]", "local field, suffix = ARGV[1], ARGV[2]",
                         "local REST = 3"]  # fmt: skip


async def test_a_script_takes_its_keys_and_args_by_name(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.hset("h", "f", "x")
        copy = COPY.register(client)
        value, tail = await copy({"target": "t", "source": "h"}, {"suffix": "!", "field": "f"}, ["a", "b"])
        assert (value, tail, await client.get("t")) == (b"x!", 2, b"x!")
        with pytest.raises(TypeError, match="differ from the declared"):
            await copy({"source": "h"}, {"suffix": "!", "field": "f"})
    finally:
        await client.aclose()


async def test_a_script_the_server_forgot_is_loaded_again(redis_url: str) -> None:
    """EVALSHA answers NOSCRIPT after a Redis restart or SCRIPT FLUSH: the script loads itself and runs."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.hset("h2", "f", "y")
        copy = COPY.register(client)
        await client.script_flush()
        assert (await client.script_exists(copy.sha)) == [False]
        value, _ = await copy({"target": "t2", "source": "h2"}, {"suffix": "?", "field": "f"})
        assert value == b"y?" and (await client.script_exists(copy.sha)) == [True]
    finally:
        await client.aclose()

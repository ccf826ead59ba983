"""Lua scripts whose KEYS and ARGV are named.

A :class:`LuaScript` lists the names of its keys and of its leading arguments once. The script's
source starts with Lua locals of those names (``local stats, record = KEYS[1], KEYS[2]``), so its
body never indexes by position, and a caller passes them by name, so the argument lists are built
from the same definition. Arguments past the named ones (a variable-length tail, such as a stream
entry's field/value pairs) start at the Lua local ``REST``.

A bound script runs by EVALSHA and loads itself again after a NOSCRIPT (a restarted or flushed
Redis), like redis-py's ``Script``, without its per-call ``isinstance`` against a Protocol class
(measurable on the proxy's hot path). A :class:`PipelinedScript` does the same over a
:class:`~services.runtime.redis_pipeline.PipelinedRedis` (the gateway's per-call record). Either
kind's ``send`` starts the script at once and returns its reply as an awaitable, so a caller can
work while Redis runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha1
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from services.runtime.redis_pipeline import PipelinedRedis


@dataclass(frozen=True, slots=True)
class LuaScript:
    keys: tuple[str, ...]  # KEYS[1], KEYS[2], ... as Lua locals
    args: tuple[str, ...]  # ARGV[1], ARGV[2], ... as Lua locals; ARGV[REST] onwards is the tail
    body: str  # Lua using those names

    @property
    def source(self) -> str:
        """The script as Redis runs it: the named locals, then the body."""
        lines = [_locals(self.keys, "KEYS"), _locals(self.args, "ARGV"), f"local REST = {len(self.args) + 1}"]
        return "\n".join(line for line in lines if line) + "\n" + self.body.lstrip("\n")

    def register(self, client: Redis) -> BoundScript:
        return BoundScript(self, client, sha1(self.source.encode()).hexdigest())

    def pipelined(self, link: PipelinedRedis) -> PipelinedScript:
        return PipelinedScript(self, link, sha1(self.source.encode()).hexdigest())

    def ordered(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any]) -> list[Any]:
        """``numkeys, *keys, *args, *rest`` as EVALSHA takes them, from the names."""
        _check(self.keys, keys, "keys")
        _check(self.args, args, "args")
        return [len(self.keys), *(keys[name] for name in self.keys), *(args[name] for name in self.args), *rest]


class Script(Protocol):
    """A script bound to a Redis client of either kind."""

    def send(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any] = ()) -> Awaitable[Any]: ...

    async def __call__(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any] = ()) -> Any: ...


@dataclass(frozen=True, slots=True)
class BoundScript:
    """A :class:`LuaScript` registered on one client."""

    script: LuaScript
    client: Redis
    sha: str  # of ``script.source``

    async def __call__(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any] = ()) -> Any:
        """Run with ``keys`` and ``args`` by name (exactly the declared ones) and ``rest`` after them."""
        _check(self.script.keys, keys, "keys")
        _check(self.script.args, args, "args")
        ordered_keys = [keys[name] for name in self.script.keys]
        ordered_args = [args[name] for name in self.script.args] + list(rest)
        try:
            return await self.client.evalsha(self.sha, len(ordered_keys), *ordered_keys, *ordered_args)
        except NoScriptError:
            await self.client.script_load(self.script.source)
            return await self.client.evalsha(self.sha, len(ordered_keys), *ordered_keys, *ordered_args)

    def send(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any] = ()) -> Awaitable[Any]:
        """Start the script (a task: its command goes out at the loop's next turn); its reply."""
        return asyncio.ensure_future(self(keys, args, rest))


@dataclass(frozen=True, slots=True)
class PipelinedScript:
    """A :class:`LuaScript` on a pipelined connection: ``send`` writes its EVALSHA before returning."""

    script: LuaScript
    link: PipelinedRedis
    sha: str  # of ``script.source``

    def send(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any] = ()) -> Awaitable[Any]:
        return self.link.evalsha(self.sha, self.script.source, self.script.ordered(keys, args, rest))

    async def __call__(self, keys: Mapping[str, str], args: Mapping[str, Any], rest: Sequence[Any] = ()) -> Any:
        return await self.send(keys, args, rest)


def _locals(names: tuple[str, ...], array: str) -> str:
    if not names:
        return ""
    return f"local {', '.join(names)} = " + ", ".join(f"{array}[{i}]" for i in range(1, len(names) + 1))


def _check(declared: tuple[str, ...], given: Mapping[str, Any], what: str) -> None:
    if set(given) != set(declared):
        raise TypeError(f"script {what} {sorted(given)} differ from the declared {list(declared)}")

"""One pipelined connection to one Redis server, for a process's hot path.

Each command is packed (hiredis) and written at once; replies come back in the order the commands
were written, so each is handed to its caller's future in that order (``asyncio.Protocol`` and a
hiredis reader: no pool, no per-command lock, timeout or retry bookkeeping). Concurrent callers
share the connection: Redis runs one command at a time anyway, and their writes and replies share
system calls when they coincide. Measured on the agent gateway's record script: see
docs/agents.md.

``send`` returns the reply's future at once, the command already written (or queued behind the
connection being opened), so a caller can go on working while Redis runs it. A caller that stops
waiting (cancelled) leaves the reply to be read and dropped in turn: the connection never loses
its place. A reply that takes longer than ``timeout_s`` (or a broken connection) fails every
command in flight with a ``redis.exceptions`` error and closes the connection; the next command
opens a new one (one timer per connection watches the oldest command, none per command).

Only plain ``redis://`` TCP servers: :func:`pipelined` gives None for a cluster, TLS or a Unix
socket, and the caller keeps its redis-py client for those.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.runtime.redis_pool import ObservedCluster


class _Link(asyncio.Protocol):
    """The connection: writes packed commands, hands replies to the futures in write order. One
    timer per connection (not per command) fails it when its oldest command waits past ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.reader = hiredis.Reader(replyError=ResponseError)
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.sent_at: collections.deque[float] = collections.deque()  # loop time of each waiting command
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def write(self, packed: bytes, future: asyncio.Future[Any]) -> None:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.waiting.append(future)
        self.sent_at.append(loop.time())
        self.transport.write(packed)
        if self._timer is None:
            self._timer = loop.call_later(self.timeout_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.sent_at:
            return
        late = self.sent_at[0] + self.timeout_s - asyncio.get_running_loop().time()
        if late <= 0:
            self.fail(RedisTimeoutError(f"no reply from Redis within {self.timeout_s:g} s"))
        else:
            self._timer = asyncio.get_running_loop().call_later(late, self._check)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            self.sent_at.popleft()
            if future.done():  # its caller stopped waiting
                continue
            if isinstance(reply, ResponseError):
                future.set_exception(_typed(reply))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def fail(self, exc: Exception) -> None:
        self.closed = True
        self.sent_at.clear()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


def _typed(reply: ResponseError) -> ResponseError:
    message = str(reply)
    return NoScriptError(message) if message.startswith("NOSCRIPT") else reply


class PipelinedRedis:
    def __init__(
        self, host: str, port: int, *, password: str | None = None, username: str | None = None, db: int = 0,
        timeout_s: float = 60.0, connect_timeout_s: float = 5.0,
    ) -> None:  # fmt: skip
        self.host, self.port, self.db = host, port, db
        self.password, self.username = password, username
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._link: _Link | None = None
        self._opening: asyncio.Task[_Link] | None = None

    def send(self, *args: Any) -> asyncio.Future[Any]:
        """Write the command now (or as soon as the connection is open); its reply's future."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        packed = hiredis.pack_command(args)
        link = self._link
        if link is not None and not link.closed:
            link.write(packed, future)
        else:
            self._queue(packed, future)
        return future

    async def execute(self, *args: Any) -> Any:
        """``send`` and wait for the reply."""
        return await self.send(*args)

    def evalsha(self, sha: str, source: str, ordered: Sequence[Any]) -> Awaitable[Any]:
        """Write ``EVALSHA sha *ordered`` now (``ordered``: numkeys, keys, args); its reply, the
        script loaded from ``source`` and run again after a NOSCRIPT (a restarted or flushed Redis)."""
        command = ("EVALSHA", sha, *ordered)
        return self._loaded(self.send(*command), command, source)

    async def _loaded(self, sent: Awaitable[Any], command: tuple[Any, ...], source: str) -> Any:
        try:
            return await sent
        except NoScriptError:
            await self.execute("SCRIPT", "LOAD", source)
            return await self.send(*command)

    async def connect(self) -> None:
        """Open the connection now, where it is not open: a first command then waits for no connect."""
        if self._link is None or self._link.closed:
            await self._opened()

    def _opened(self) -> asyncio.Task[_Link]:
        if self._opening is None or self._opening.done():
            self._opening = asyncio.ensure_future(self._open())
        return self._opening

    def _queue(self, packed: bytes, future: asyncio.Future[Any]) -> None:
        opening = self._opened()

        def written(task: asyncio.Task[_Link]) -> None:
            if future.done():
                return
            if task.cancelled() or task.exception() is not None:
                future.set_exception(task.exception() or RedisConnectionError("opening the connection was cancelled"))
            else:
                task.result().write(packed, future)

        opening.add_done_callback(written)

    async def _open(self) -> _Link:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, link = await loop.create_connection(lambda: _Link(self.timeout_s), self.host, self.port)
                setup = []
                if self.password is not None:
                    auth = (self.username, self.password) if self.username else (self.password,)
                    setup.append(("AUTH", *auth))
                if self.db:
                    setup.append(("SELECT", self.db))
                replies = [loop.create_future() for _ in setup]
                for command, reply in zip(setup, replies, strict=True):
                    link.write(hiredis.pack_command(command), reply)
                try:
                    await asyncio.gather(*replies)
                except BaseException:  # refused AUTH or SELECT, or the timeout: this link is not used
                    link.fail(RedisConnectionError("connection setup failed"))
                    raise
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"cannot connect to Redis at {self.host}:{self.port}: {exc}") from exc
        self._link = link
        return link

    def close(self) -> None:
        if self._link is not None:
            self._link.fail(RedisConnectionError("closed"))
            self._link = None


def pipelined(client: Redis) -> PipelinedRedis | None:
    """A pipelined connection to the server ``client`` talks to; None unless that is one plain TCP
    server (a cluster, TLS and Unix sockets keep the redis-py client)."""
    if isinstance(client, ObservedCluster):
        return None
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs or issubclass(client.connection_pool.connection_class, SSLConnection):
        return None
    return PipelinedRedis(
        str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379)), password=kwargs.get("password"),
        username=kwargs.get("username"), db=int(kwargs.get("db", 0) or 0),
        timeout_s=float(kwargs.get("socket_timeout") or 60.0),
        connect_timeout_s=float(kwargs.get("socket_connect_timeout") or 5.0),
    )  # fmt: skip


ScriptRun = Callable[[Sequence[Any], Sequence[Any]], Awaitable[Any]]


def script_runner(client: Redis, link: PipelinedRedis | None, source: str) -> ScriptRun:
    """``run(keys, args)``: the Lua script over the pipelined ``link`` where there is one (loaded
    again after a NOSCRIPT), else over the redis-py ``client``."""
    if link is None:
        script = client.register_script(source)
        return lambda keys_, args: script(keys=list(keys_), args=list(args))
    sha = hashlib.sha1(source.encode()).hexdigest()
    return lambda keys_, args: link.evalsha(sha, source, [len(keys_), *keys_, *args])

"""One ``send()`` per response instead of two: uvicorn writes a response's status line and headers,
then its body, as two transport writes, and each is a ``send()`` of its own (on loopback the send
runs the receiver's whole TCP receive path, and the client wakes once for the head, once for the
body). :class:`BatchedWritesHttp` gathers the writes made in one event-loop step and sends them
together at the end of the step: a plain response goes out in one segment; a streamed one (SSE)
still sends each chunk in the step that wrote it, so nothing is held back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.runtime.http_errors import ErrorBodyHttp


class BatchedTransport:
    """A socket transport whose writes within one loop step are joined into one write."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(chunk) for chunk in self._pending)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written goes out before the connection closes
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # everything else: the socket transport's own
        return getattr(self._transport, name)


class BatchedWritesHttp(ErrorBodyHttp):
    """uvicorn's HTTP protocol (with the platform's 400 answer) writing through a
    :class:`BatchedTransport`: ``uvicorn.Config(app, http=BatchedWritesHttp)``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        batched: Any = BatchedTransport(transport, self.loop)
        super().connection_made(batched)

"""Creating a Redis consumer group, once for the sync client (the trainer) and the async one (the
API and the worker): a new group reads its stream from the first entry, and creating it again is
not an error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
import redis.asyncio

FROM_FIRST_ENTRY = "0"  # a new group delivers every entry already in the stream


@contextmanager
def _existing_group_ok() -> Iterator[None]:
    """Let Redis's BUSYGROUP (the group exists) pass; every other error propagates."""
    try:
        yield
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def ensure_group(client: redis.Redis, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` (and the stream), unless it exists."""
    with _existing_group_ok():
        client.xgroup_create(stream, group, id=FROM_FIRST_ENTRY, mkstream=True)


async def ensure_group_async(client: redis.asyncio.Redis, stream: str, group: str) -> None:
    """:func:`ensure_group` for an asyncio client."""
    with _existing_group_ok():
        await client.xgroup_create(stream, group, id=FROM_FIRST_ENTRY, mkstream=True)

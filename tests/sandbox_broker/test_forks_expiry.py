"""Shared setups expire safely when many leases arrive at once (each lease runs the expiry first).

Found under load: two leases expiring the same snapshot both deleted its entry, and the second got
``KeyError``, a 500 on ``POST /leases`` (376 of them in a two-job demo run).
"""

from __future__ import annotations

import asyncio
import time

from services.sandbox_broker.forks import SharedSetups, _Entry


class SnapshotStore:
    """What SharedSetups needs of a forking backend; dropping a snapshot takes a moment (an await)."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    async def snapshot(self, sandbox_id: str) -> str:
        return "snap-" + sandbox_id

    async def drop_snapshot(self, snapshot_id: str) -> None:
        await asyncio.sleep(0)
        self.dropped.append(snapshot_id)


async def _expire_concurrently() -> tuple[SnapshotStore, SharedSetups]:
    store = SnapshotStore()
    setups = SharedSetups(store, ttl_s=1.0)  # type: ignore[arg-type]  # only the forking part is used
    loop = asyncio.get_running_loop()
    for name in ("a", "b", "c"):
        ready: asyncio.Future[str | None] = loop.create_future()
        ready.set_result(f"snap-{name}")
        setups.entries[name] = _Entry(ready, used_at=time.monotonic() - 60)  # unused for a minute
    await asyncio.gather(*(setups._expire() for _ in range(4)))
    return store, setups


def test_leases_expiring_the_same_snapshots_at_once_drop_each_once_and_none_fails() -> None:
    store, setups = asyncio.run(_expire_concurrently())
    assert sorted(store.dropped) == ["snap-a", "snap-b", "snap-c"]
    assert setups.entries == {}

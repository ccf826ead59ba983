"""Items reclaimed from a dead worker run before any new item of their job (issue 29): with fewer
free slots than reclaimable items, the rest used to wait for the next reclaim tick while new items
took every slot freed in between."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import redis

from services.rollout_api.worker.runner import Delivery
from services.rollout_api.worker.worker import Worker
from services.runtime.tokenizer import write_tokenizer_dir
from tests.rollout_api.inprocess import FAST, admit, held_by_a_dead_worker, records, run_worker, setup_job, task

HELD = 6  # items a killed worker held
NEW = 6  # items queued behind them


def test_reclaimed_items_start_before_new_ones(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    setup_job(redis_client)
    asyncio.run(admit(redis_url, "dl.held", [task(f"held{i}") for i in range(HELD)]))
    held_by_a_dead_worker(redis_client, deliveries=1)  # the killed worker's items, never heartbeated again
    asyncio.run(admit(redis_url, "dl.new", [task(f"new{i}") for i in range(NEW)]))
    time.sleep(2 * FAST["reclaim_idle_s"])  # the held items are reclaimable before the worker starts
    started: list[str] = []

    def spy(worker: Worker) -> None:
        run = worker.runner.run

        async def recording(delivery: Delivery) -> Any:
            started.append(delivery.item.task.id)
            return await run(delivery)

        worker.runner.run = recording  # type: ignore[method-assign]

    # two slots for six reclaimable items; the periodic scan far apart, as in production (5 s)
    done = lambda: len(records(redis_client)) == HELD + NEW  # noqa: E731
    asyncio.run(run_worker(redis_url, write_tokenizer_dir(tmp_path / "model"), done, spy, concurrency=2,
                           reclaim_interval_s=5.0))  # fmt: skip
    assert sorted(started) == sorted([f"held{i}" for i in range(HELD)] + [f"new{i}" for i in range(NEW)])
    assert all(t.startswith("held") for t in started[:HELD]), started

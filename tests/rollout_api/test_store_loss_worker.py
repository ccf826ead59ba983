"""A worker whose Redis came back empty stops the episodes it runs and records nothing for them
(issue 29): their jobs are gone, and a record or a give-back would recreate keys of a job that no
longer exists, as four still-running episodes once did."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis

from services.protocol import keys
from services.rollout_api.worker.worker import Worker
from services.runtime.tokenizer import write_tokenizer_dir
from tests.rollout_api.inprocess import admit, run_worker, setup_job, task


class LongEpisode:
    """An episode that runs until it is stopped (its LLM and sandbox are not what is tested)."""

    def __init__(self, *args: Any) -> None:
        pass

    async def run(self) -> Any:
        await asyncio.sleep(3600)


def test_running_episodes_stop_without_a_record_when_redis_comes_back_empty(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("services.rollout_api.worker.runner.Episode", LongEpisode)
    setup_job(redis_client)
    asyncio.run(admit(redis_url, "dl.lost", [task("a"), task("b")]))
    seen: list[Worker] = []
    flushed: list[bool] = []

    def done() -> bool:
        worker = seen[0]
        if not flushed and len(worker.running) == 2:
            redis_client.flushall()  # Redis restarted without persistence
            flushed.append(True)
        return bool(flushed) and not worker.running

    asyncio.run(run_worker(redis_url, write_tokenizer_dir(tmp_path / "model"), done, seen.append))
    worker = seen[0]
    assert flushed and not worker.running and worker.generation.losses == 1
    leftovers: Any = redis_client.keys(f"{keys.PREFIX}:job:*")
    assert leftovers == []  # nothing recreated for the vanished job
    assert redis_client.get(keys.store_generation()) is not None  # a new generation, set by the worker

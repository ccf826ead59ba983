"""A worker whose Redis came back empty stops the episodes it runs and records nothing for them
(issue 29): their jobs are gone, and a record or a give-back would recreate keys of a job that no
longer exists, as four still-running episodes once did."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from services.protocol import keys
from services.rollout_api.redis_scripts import Outcome, Scripts, Taken
from services.rollout_api.worker.worker import Worker
from services.runtime.tokenizer import write_tokenizer_dir
from tests.rollout_api.inprocess import JOB, admit, run_worker, setup_job, task


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
        if not flushed and len(worker.running) == 2 and redis_client.hlen(keys.attempts(JOB)) == 2:  # both taken
            redis_client.flushall()  # Redis restarted without persistence
            flushed.append(True)
        return bool(flushed) and not worker.running

    asyncio.run(run_worker(redis_url, write_tokenizer_dir(tmp_path / "model"), done, seen.append))
    worker = seen[0]
    assert flushed and not worker.running and worker.generation.losses == 1
    leftovers: Any = redis_client.keys(f"{keys.PREFIX}:job:*")
    assert leftovers == []  # nothing recreated for the vanished job
    assert redis_client.get(keys.store_generation()) is not None  # a new generation, set by the worker


def test_the_worker_scripts_recreate_nothing_of_a_vanished_job(redis_url: str, redis_client: redis.Redis) -> None:
    """An episode that ends between the loss and the worker noticing it: its take, give-back,
    failed-attempt counter and record find the rollout missing and write nothing (the record is
    answered as a duplicate)."""

    async def scripts_on_an_empty_store() -> tuple[Taken, str | None]:
        client = AsyncRedis.from_url(redis_url)
        try:
            scripts = Scripts(client)
            taken = await scripts.take("gone", "r1", "t1")
            await scripts.give_back("gone", "r1", "t1")
            await scripts.count("gone", "r1", "failed_attempts:sandbox")
            outcome = Outcome("t1", 1, "completed", 1.0, False, 3, True)
            entry = await scripts.publish("gone", "r1", outcome, {"body": b"x"}, maxlen=100, now=1.0)
            return taken, entry
        finally:
            await client.aclose()

    redis_client.flushall()
    taken, entry = asyncio.run(scripts_on_an_empty_store())
    assert taken.attempt == -1 and entry is None
    assert redis_client.keys(f"{keys.PREFIX}:job:*") == []

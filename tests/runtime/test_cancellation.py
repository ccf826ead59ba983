"""A cancelled task that talks to Redis ends, and a stop that cancels a task returns.

Python 3.11's ``asyncio.wait_for`` (under which redis-py writes every command) drops a cancellation
that arrives as the write completes; a broker's reaper loop carried on after its cancellation and
the broker's graceful stop hung until SIGKILL (its image store then stayed over budget)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from services.runtime.redis_pool import open_redis
from services.runtime.tasks import cancel_and_wait

TRIALS = 80  # redis-py's own connection dropped about 1 cancellation in 3 here


def test_a_task_cancelled_between_redis_commands_always_ends(redis_url: str) -> None:
    async def scenario() -> list[int]:
        client = open_redis(redis_url, size=4)
        carried_on = []
        rng = random.Random(7)
        for trial in range(TRIALS):

            async def loop() -> None:
                while True:
                    await asyncio.sleep(0.001)
                    await client.set("cancel-probe", "x", px=1000)

            task = asyncio.create_task(loop())
            await asyncio.sleep(rng.uniform(0.0, 0.01))
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=0.5)
            if not done:
                carried_on.append(trial)
                await cancel_and_wait(task, retry_s=0.05)
        await client.aclose(close_connection_pool=True)
        return carried_on

    assert asyncio.run(scenario()) == []


def test_cancel_and_wait_stops_a_task_that_drops_its_first_cancellation() -> None:
    async def scenario() -> tuple[int, bool]:
        cancels = 0

        async def stubborn() -> None:
            nonlocal cancels
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancels += 1
                    if cancels == 1:
                        continue  # what a library that swallows a cancellation does
                    raise

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task, retry_s=0.05), 5)
        return cancels, task.cancelled()

    assert asyncio.run(scenario()) == (2, True)


def test_cancel_and_wait_passes_the_callers_own_cancellation_on() -> None:
    async def scenario() -> Any:
        async def slow_to_stop() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await asyncio.sleep(0.5)  # cleanup that takes a while
                raise

        inner = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        stopper = asyncio.create_task(cancel_and_wait(inner, retry_s=5))
        await asyncio.sleep(0.05)
        stopper.cancel()  # the stopping task is itself cancelled while it waits
        with pytest.raises(asyncio.CancelledError):
            await stopper
        await cancel_and_wait(inner)
        return inner.cancelled()

    assert asyncio.run(scenario()) is True

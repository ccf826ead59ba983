"""``DELETE /rollouts/{id}``: mark the rollout cancelled and drop its queued items.

Queued items (not yet delivered to any worker) are deleted from the work stream and published as
``cancelled`` here. Items a worker already holds are seen as cancelled by that worker: it stops the
episode (its LLM call is aborted, its sandbox released) and publishes it as ``cancelled``. The
publish script keeps one record per trajectory, so the two paths never both publish.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio import Redis

from services.protocol import Status, Task, WorkItem, keys
from services.protocol.keys import WORKERS_GROUP
from services.protocol.work import WorkEntry
from services.rollout_api.publishing import publish, trajectory_shell
from services.rollout_api.redis_scripts import Scripts

log = logging.getLogger(__name__)
PAGE = 500


async def last_delivered(redis: Redis, job: str) -> str:
    groups: Any = await redis.xinfo_groups(keys.work_stream(job))
    for group in groups:
        name = group["name"]
        if (name.decode() if isinstance(name, bytes) else name) == WORKERS_GROUP:
            last = group["last-delivered-id"]
            return last.decode() if isinstance(last, bytes) else str(last)
    return "0-0"


async def drop_queued(redis: Redis, scripts: Scripts, job: str, rollout_id: str, *, maxlen: int) -> int:
    """Delete and publish as cancelled the rollout's undelivered items; returns how many."""
    stream = keys.work_stream(job)
    start = "(" + await last_delivered(redis, job)
    dropped = 0
    tasks: dict[str, Task] = {}
    while True:
        entries: Any = await redis.xrange(stream, min=start, max="+", count=PAGE)
        if not entries:
            return dropped
        for entry_id, fields in entries:
            entry = WorkEntry.from_fields(fields)
            if entry.rollout_id != rollout_id:
                continue
            try:
                item = await _decode(redis, job, entry.item, tasks)
            except (KeyError, ValueError):
                continue  # undecodable: the workers move it to the dead letters
            await redis.xdel(stream, entry_id)
            traj = trajectory_shell(item, 1, Status.CANCELLED)
            if await publish(scripts, traj, maxlen=maxlen, ran=False) is not None:
                dropped += 1
        start = "(" + entries[-1][0].decode()


async def _decode(redis: Redis, job: str, raw: bytes, tasks: dict[str, Task]) -> WorkItem:
    rollout_id, task_id = WorkItem.task_ref(raw)
    if task_id not in tasks:
        stored: Any = await redis.hget(keys.rollout_tasks(job, rollout_id), task_id)
        if stored is None:
            raise KeyError(task_id)
        tasks[task_id] = Task.model_validate_json(stored)
    return WorkItem.decode(raw, tasks[task_id])


async def cancel_rollout(redis: Redis, scripts: Scripts, job: str, rollout_id: str, *, maxlen: int) -> int:
    await redis.hset(keys.rollout_record(job, rollout_id), "cancelled", "1")
    dropped = await drop_queued(redis, scripts, job, rollout_id, maxlen=maxlen)
    log.info("rollout %s cancelled: %d queued items dropped", rollout_id, dropped)
    return dropped

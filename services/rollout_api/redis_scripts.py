"""The Lua scripts that keep a job's counters consistent with its streams.

Each script touches only one job's keys (one Redis Cluster slot, see ``protocol.keys``) and runs
atomically, so a crash between two steps never leaves a counter out of step with a stream:

- ``admit`` (API): idempotency check, queue quota, rollout record and every XADD, all or nothing;
- ``take`` (worker): start an attempt of a trajectory (counts a first take as queued -> in flight);
- ``give_back`` (worker shutting down): undo ``take``, the item is queued again for another worker;
- ``publish`` (worker, API on cancel): the single final record of a trajectory, with its counters
  (an evaluation sample's goes to the eval stream, and its result to the rollout's results hash).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from services.protocol import counters, keys

ADMIT = """
if KEYS[1] ~= KEYS[7] then
  local existing = redis.call('GET', KEYS[1])
  if existing then return {0, existing} end
end
local max_queued = tonumber(redis.call('HGET', KEYS[3], 'max_queued') or '0')
local queued = tonumber(redis.call('HGET', KEYS[2], 'queued') or '0')
local n = tonumber(ARGV[3])
if queued + n > max_queued then return {-1, tostring(queued)} end
local rid = ARGV[1]
local now = ARGV[2]
local nfields = tonumber(ARGV[5])
local i = 6
for f = 1, nfields do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', KEYS[4], 'queued', n, 'in_flight', 0, 'done', 0, 'created_at', now)
redis.call('ZADD', KEYS[5], now, rid)
for k = 1, n do
  redis.call('XADD', KEYS[6], '*', 'rollout', rid, 'trajectory', ARGV[i], 'item', ARGV[i + 1])
  i = i + 2
end
redis.call('HINCRBY', KEYS[2], 'queued', n)
redis.call('HINCRBY', KEYS[2], 'submitted', n)
if KEYS[1] ~= KEYS[7] then redis.call('SET', KEYS[1], rid, 'EX', tonumber(ARGV[4])) end
return {1, rid}
"""

TAKE = """
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then return {-1, 0} end
local attempt = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if attempt == 1 then
  redis.call('HINCRBY', KEYS[2], 'queued', -1)
  redis.call('HINCRBY', KEYS[2], 'in_flight', 1)
  redis.call('HINCRBY', KEYS[3], 'queued', -1)
  redis.call('HINCRBY', KEYS[3], 'in_flight', 1)
end
redis.call('HINCRBY', KEYS[2], 'attempts', 1)
local cancelled = tonumber(redis.call('HGET', KEYS[3], 'cancelled') or '0')
return {attempt, cancelled}
"""

GIVE_BACK = """
local attempt = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if attempt <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HINCRBY', KEYS[2], 'queued', 1)
  redis.call('HINCRBY', KEYS[2], 'in_flight', -1)
  redis.call('HINCRBY', KEYS[3], 'queued', 1)
  redis.call('HINCRBY', KEYS[3], 'in_flight', -1)
end
redis.call('HINCRBY', KEYS[2], 'attempts', -1)
return attempt
"""

PUBLISH = """
local tid = ARGV[1]
if redis.call('HSETNX', KEYS[1], tid, ARGV[2]) == 0 then return 0 end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, 12))
if ARGV[11] ~= '' then redis.call('HSET', KEYS[8], tid, ARGV[11]) end
local status = ARGV[4]
local now = tonumber(ARGV[5])
local taken = redis.call('HEXISTS', KEYS[7], tid) == 1
local field = taken and 'in_flight' or 'queued'
redis.call('HINCRBY', KEYS[3], field, -1)
redis.call('HINCRBY', KEYS[4], field, -1)
redis.call('HINCRBY', KEYS[3], 'status:' .. status, 1)
redis.call('HINCRBY', KEYS[4], 'status:' .. status, 1)
redis.call('HINCRBY', KEYS[3], 'finished', 1)
if ARGV[10] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[10], 1) end
redis.call('HINCRBY', KEYS[3], 'turns', tonumber(ARGV[8]))
if ARGV[7] == '1' then
  redis.call('HINCRBY', KEYS[3], 'turn_cap', 1)
  redis.call('HINCRBY', KEYS[4], 'turn_cap', 1)
end
local done = redis.call('HINCRBY', KEYS[4], 'done', 1)
local total = tonumber(redis.call('HGET', KEYS[4], 'total') or '0')
if done >= math.ceil(0.9 * total) and redis.call('HEXISTS', KEYS[4], 't90') == 0 then
  redis.call('HSET', KEYS[4], 't90', ARGV[5])
end
redis.call('HSET', KEYS[4], 'last_finish', ARGV[5])
if taken and ARGV[9] == '1' then
  redis.call('RPUSH', KEYS[5], ARGV[6])
  redis.call('LPUSH', KEYS[6], ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. ARGV[7])
  redis.call('LTRIM', KEYS[6], 0, 9999)
end
return id
"""


@dataclass(frozen=True, slots=True)
class Admitted:
    outcome: int  # 1 admitted, 0 duplicate idempotency key, -1 over the queue quota
    value: str  # rollout id (1, 0) or the current queue depth (-1)


@dataclass(frozen=True, slots=True)
class Taken:
    attempt: int  # -1: the trajectory is already finished (drop the item)
    cancelled: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``publish`` records about a finished trajectory beside its stream entry."""

    trajectory_id: str
    attempt: int
    status: str
    duration_s: float
    turn_cap: bool
    turns: int
    ran: bool  # an episode ran (not dropped from the queue): its duration enters the tail figures
    infra_stage: str | None = None  # an infra_error: the stage of its last failure (counted per stage)
    mode: str = "train"  # "eval": published to the eval stream, with its result for pass@k
    result: str = ""  # an eval sample's ``SampleResult`` JSON


class Scripts:
    """The scripts registered on one client."""

    def __init__(self, client: Redis) -> None:
        self._admit = client.register_script(ADMIT)
        self._take = client.register_script(TAKE)
        self._give_back = client.register_script(GIVE_BACK)
        self._publish = client.register_script(PUBLISH)

    async def admit(
        self,
        job: str,
        rollout_id: str,
        idempotency_key: str | None,
        record: Mapping[str, str],
        items: Sequence[tuple[str, bytes]],
        *,
        now: float,
        idempotency_ttl_s: int,
    ) -> Admitted:
        sentinel = keys.job_stats(job)
        idem = keys.idempotency(job, idempotency_key) if idempotency_key else sentinel
        script_keys = [
            idem, keys.job_stats(job), keys.job_record(job), keys.rollout_record(job, rollout_id),
            keys.rollout_index(job), keys.work_stream(job), sentinel,
        ]  # fmt: skip
        args: list[Any] = [rollout_id, repr(now), len(items), idempotency_ttl_s, len(record)]
        for name, value in record.items():
            args += [name, value]
        for trajectory_id, body in items:
            args += [trajectory_id, body]
        outcome, value = await self._admit(keys=script_keys, args=args)
        return Admitted(int(outcome), _text(value))

    async def take(self, job: str, rollout_id: str, trajectory_id: str) -> Taken:
        script_keys = [
            keys.attempts(job), keys.job_stats(job), keys.rollout_record(job, rollout_id), keys.finished(job),
        ]  # fmt: skip
        attempt, cancelled = await self._take(keys=script_keys, args=[trajectory_id])
        return Taken(int(attempt), bool(int(cancelled)))

    async def give_back(self, job: str, rollout_id: str, trajectory_id: str) -> None:
        script_keys = [keys.attempts(job), keys.job_stats(job), keys.rollout_record(job, rollout_id)]
        await self._give_back(keys=script_keys, args=[trajectory_id])

    async def publish(
        self, job: str, rollout_id: str, outcome: Outcome, fields: Mapping[str, str | bytes], *, maxlen: int, now: float
    ) -> str | None:
        """XADD the record unless this trajectory already has one; returns the entry id or None."""
        script_keys = [
            keys.finished(job), keys.rollout_stream(job, outcome.mode), keys.job_stats(job),
            keys.rollout_record(job, rollout_id), keys.rollout_episodes(job, rollout_id), keys.job_recent(job),
            keys.attempts(job), keys.rollout_results(job, rollout_id),
        ]  # fmt: skip
        args: list[Any] = [
            outcome.trajectory_id, outcome.attempt, maxlen, outcome.status, repr(now),
            f"{outcome.duration_s:.3f}", "1" if outcome.turn_cap else "0", outcome.turns, "1" if outcome.ran else "0",
            counters.infra_error_trajectories(outcome.infra_stage) if outcome.infra_stage else "", outcome.result,
        ]  # fmt: skip
        for name, value in fields.items():
            args += [name, value]
        entry = await self._publish(keys=script_keys, args=args)
        return None if entry == 0 else _text(entry)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

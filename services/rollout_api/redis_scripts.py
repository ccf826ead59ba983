"""The Lua scripts that keep a job's counters consistent with its streams.

Each script names its KEYS and ARGV (``runtime.lua``), touches only one job's keys (one Redis
Cluster slot, see ``protocol.keys``) and runs atomically, so a crash between two steps never
leaves a counter out of step with a stream:

- ``admit`` (API): idempotency check, queue quota, rollout record and every XADD, all or nothing;
- ``take`` (worker): start an attempt of a trajectory (counts a first take as queued -> in flight);
- ``give_back`` (worker shutting down): undo ``take``, the item is queued again for another worker;
- ``count`` (worker): one more of a job counter (a failed attempt at its stage);
- ``publish`` (worker, API on cancel): the single final record of a trajectory, with its counters
  (an evaluation sample's goes to the eval stream, and its result to the rollout's results hash).

The worker's (``take``, ``give_back``, ``count``, ``publish``) do nothing where the rollout's record is
missing (records are never deleted: the store lost its state, restarted empty): a running episode
of a job that no longer exists is never recorded into keys recreated for it. ``take`` and
``publish`` answer as for a trajectory already finished, so its item is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any

from redis.asyncio import Redis

from services.protocol import counters, keys, work
from services.runtime.lua import LuaScript

ADMIT = LuaScript(
    keys=("idem", "stats", "job", "rollout", "rollouts", "work", "sentinel"),  # idem == sentinel: no key given
    args=("rollout_id", "now", "count", "idem_ttl_s", "record_fields"),
    # REST: ``record_fields`` (field, value) pairs of the rollout record, then ``count`` (trajectory id, item)
    body=Template("""
if idem ~= sentinel then
  local existing = redis.call('GET', idem)
  if existing then return {0, existing} end
end
local max_queued = tonumber(redis.call('HGET', job, 'max_queued') or '0')
local queued = tonumber(redis.call('HGET', stats, 'queued') or '0')
local n = tonumber(count)
if queued + n > max_queued then return {-1, tostring(queued)} end
local i = REST
for f = 1, tonumber(record_fields) do
  redis.call('HSET', rollout, ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', rollout, 'queued', n, 'in_flight', 0, 'done', 0, 'created_at', now)
redis.call('ZADD', rollouts, now, rollout_id)
for k = 1, n do
  redis.call('XADD', work, '*', '$ROLLOUT', rollout_id, '$TRAJECTORY', ARGV[i], '$ITEM', ARGV[i + 1])
  i = i + 2
end
redis.call('HINCRBY', stats, 'queued', n)
redis.call('HINCRBY', stats, 'submitted', n)
if idem ~= sentinel then redis.call('SET', idem, rollout_id, 'EX', tonumber(idem_ttl_s)) end
return {1, rollout_id}
""").substitute(ROLLOUT=work.ROLLOUT, TRAJECTORY=work.TRAJECTORY, ITEM=work.ITEM),
)

TAKE = LuaScript(
    keys=("attempts", "stats", "rollout", "finished"),
    args=("trajectory_id",),
    body="""
if redis.call('EXISTS', rollout) == 0 then return {-1, 0} end
if redis.call('HEXISTS', finished, trajectory_id) == 1 then return {-1, 0} end
local attempt = redis.call('HINCRBY', attempts, trajectory_id, 1)
if attempt == 1 then
  redis.call('HINCRBY', stats, 'queued', -1)
  redis.call('HINCRBY', stats, 'in_flight', 1)
  redis.call('HINCRBY', rollout, 'queued', -1)
  redis.call('HINCRBY', rollout, 'in_flight', 1)
end
redis.call('HINCRBY', stats, 'attempts', 1)
local cancelled = tonumber(redis.call('HGET', rollout, 'cancelled') or '0')
return {attempt, cancelled}
""",
)

GIVE_BACK = LuaScript(
    keys=("attempts", "stats", "rollout"),
    args=("trajectory_id",),
    body="""
if redis.call('EXISTS', rollout) == 0 then return 0 end
local attempt = redis.call('HINCRBY', attempts, trajectory_id, -1)
if attempt <= 0 then
  redis.call('HDEL', attempts, trajectory_id)
  redis.call('HINCRBY', stats, 'queued', 1)
  redis.call('HINCRBY', stats, 'in_flight', -1)
  redis.call('HINCRBY', rollout, 'queued', 1)
  redis.call('HINCRBY', rollout, 'in_flight', -1)
end
redis.call('HINCRBY', stats, 'attempts', -1)
return attempt
""",
)

PUBLISH = LuaScript(
    keys=("finished", "trajectories", "stats", "rollout", "episodes", "recent", "attempts", "results"),
    args=(
        "trajectory_id",
        "attempt",
        "maxlen",
        "status",
        "now",
        "duration_s",
        "turn_cap",
        "turns",
        "ran",
        "infra_counter",  # the stats field counting infra_error trajectories at their stage; '' for none
        "result",  # an evaluation sample's ``SampleResult`` JSON for ``results``; '' for a training one
    ),  # fmt: skip
    # REST: the trajectory stream entry's (field, value) pairs
    body="""
if redis.call('EXISTS', rollout) == 0 then return 0 end
if redis.call('HSETNX', finished, trajectory_id, attempt) == 0 then return 0 end
local id = redis.call('XADD', trajectories, 'MAXLEN', '~', maxlen, '*', unpack(ARGV, REST))
if result ~= '' then redis.call('HSET', results, trajectory_id, result) end
local taken = redis.call('HEXISTS', attempts, trajectory_id) == 1
local field = taken and 'in_flight' or 'queued'
redis.call('HINCRBY', stats, field, -1)
redis.call('HINCRBY', rollout, field, -1)
redis.call('HINCRBY', stats, 'status:' .. status, 1)
redis.call('HINCRBY', rollout, 'status:' .. status, 1)
redis.call('HINCRBY', stats, 'finished', 1)
if infra_counter ~= '' then redis.call('HINCRBY', stats, infra_counter, 1) end
redis.call('HINCRBY', stats, 'turns', tonumber(turns))
if turn_cap == '1' then
  redis.call('HINCRBY', stats, 'turn_cap', 1)
  redis.call('HINCRBY', rollout, 'turn_cap', 1)
end
local done = redis.call('HINCRBY', rollout, 'done', 1)
local total = tonumber(redis.call('HGET', rollout, 'total') or '0')
if done >= math.ceil(0.9 * total) and redis.call('HEXISTS', rollout, 't90') == 0 then
  redis.call('HSET', rollout, 't90', now)
end
redis.call('HSET', rollout, 'last_finish', now)
if taken and ran == '1' then
  redis.call('RPUSH', episodes, duration_s)
  redis.call('LPUSH', recent, now .. ' ' .. duration_s .. ' ' .. turn_cap)
  redis.call('LTRIM', recent, 0, 9999)
end
return id
""",
)


COUNT = LuaScript(
    keys=("stats", "rollout"),
    args=("field",),
    body="""
if redis.call('EXISTS', rollout) == 0 then return 0 end
return redis.call('HINCRBY', stats, field, 1)
""",
)


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
        self._admit = ADMIT.register(client)
        self._take = TAKE.register(client)
        self._give_back = GIVE_BACK.register(client)
        self._count = COUNT.register(client)
        self._publish = PUBLISH.register(client)

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
        script_keys = {
            "idem": keys.idempotency(job, idempotency_key) if idempotency_key else sentinel,
            "stats": keys.job_stats(job), "job": keys.job_record(job), "rollout": keys.rollout_record(job, rollout_id),
            "rollouts": keys.rollout_index(job), "work": keys.work_stream(job), "sentinel": sentinel,
        }  # fmt: skip
        args = {"rollout_id": rollout_id, "now": repr(now), "count": len(items), "idem_ttl_s": idempotency_ttl_s,
                "record_fields": len(record)}  # fmt: skip
        rest: list[Any] = [x for pair in record.items() for x in pair] + [x for pair in items for x in pair]
        outcome, value = await self._admit(script_keys, args, rest)
        return Admitted(int(outcome), _text(value))

    async def take(self, job: str, rollout_id: str, trajectory_id: str) -> Taken:
        script_keys = {"attempts": keys.attempts(job), "stats": keys.job_stats(job),
                       "rollout": keys.rollout_record(job, rollout_id), "finished": keys.finished(job)}  # fmt: skip
        attempt, cancelled = await self._take(script_keys, {"trajectory_id": trajectory_id})
        return Taken(int(attempt), bool(int(cancelled)))

    async def give_back(self, job: str, rollout_id: str, trajectory_id: str) -> None:
        script_keys = {"attempts": keys.attempts(job), "stats": keys.job_stats(job),
                       "rollout": keys.rollout_record(job, rollout_id)}  # fmt: skip
        await self._give_back(script_keys, {"trajectory_id": trajectory_id})

    async def count(self, job: str, rollout_id: str, field: str) -> None:
        """One more of the job's counter ``field`` (nothing for a rollout that no longer exists)."""
        await self._count({"stats": keys.job_stats(job), "rollout": keys.rollout_record(job, rollout_id)},
                          {"field": field})  # fmt: skip

    async def publish(
        self, job: str, rollout_id: str, outcome: Outcome, fields: Mapping[str, str | bytes], *, maxlen: int, now: float
    ) -> str | None:
        """XADD the record unless this trajectory already has one; returns the entry id or None."""
        script_keys = {
            "finished": keys.finished(job), "trajectories": keys.rollout_stream(job, outcome.mode),
            "stats": keys.job_stats(job), "rollout": keys.rollout_record(job, rollout_id),
            "episodes": keys.rollout_episodes(job, rollout_id), "recent": keys.job_recent(job),
            "attempts": keys.attempts(job), "results": keys.rollout_results(job, rollout_id),
        }  # fmt: skip
        args = {
            "trajectory_id": outcome.trajectory_id, "attempt": outcome.attempt, "maxlen": maxlen,
            "status": outcome.status, "now": repr(now), "duration_s": f"{outcome.duration_s:.3f}",
            "turn_cap": "1" if outcome.turn_cap else "0", "turns": outcome.turns, "ran": "1" if outcome.ran else "0",
            "infra_counter": counters.infra_error_trajectories(outcome.infra_stage) if outcome.infra_stage else "",
            "result": outcome.result,
        }  # fmt: skip
        entry = await self._publish(script_keys, args, [x for pair in fields.items() for x in pair])
        return None if entry == 0 else _text(entry)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

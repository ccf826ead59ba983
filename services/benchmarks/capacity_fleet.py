"""The fleet measurements of ``rollout bench capacity``: one window of the fleet bench's stack with a
given number of episodes in flight (0: the idle stack), read as CPU by role, LLM turns, Redis
commands (INFO commandstats) and sandbox leases (the broker's lease-start histogram count)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from services.benchmarks import fleet
from services.benchmarks import fleet_workload as workload
from services.benchmarks.capacity_model import ROLES
from services.benchmarks.fleet_stack import Stack

SAMPLING_COMMANDS = ("cmdstat_info",)  # this module's own reads, left out of the platform's count


def redis_commands(client: redis.Redis) -> dict[str, float]:
    """Calls so far per command (``evalsha``, ``xadd``, ...), this module's own reads left out."""
    stats: Any = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): float(v["calls"]) for k, v in stats.items() if k not in SAMPLING_COMMANDS}


def broker_leases(http: httpx.Client, stack: Stack) -> float:
    return sum(fleet.metric_total(http.get(f"{s.url}/metrics").text, "rollout_broker_lease_start_seconds_count")
               for s in stack.services if s.role == "broker")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sample:
    wall: float
    turns: float  # LLM calls answered, all workers
    cpu: dict[str, float]  # CPU seconds by role, Redis included
    commands: dict[str, float]  # Redis commands served, per command
    leases: float

    @classmethod
    def take(cls, http: httpx.Client, stack: fleet.Fleet, client: redis.Redis) -> Sample:
        commands = redis_commands(client)
        return cls(time.time(), fleet.llm_calls(http, stack.workers), fleet.cpu_snapshot(stack, client),
                   commands, broker_leases(http, stack.stack))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Window:
    """What the stack did between two samples."""

    in_flight: int
    seconds: float
    turns: float
    cpu_s: dict[str, float]  # by role of ``ROLES``
    commands_by_name: dict[str, float]
    leases: float

    @classmethod
    def between(cls, n: int, before: Sample, after: Sample) -> Window:
        cpu = {r: after.cpu.get(r, 0.0) - before.cpu.get(r, 0.0) for r in ROLES}
        commands = {k: v - before.commands.get(k, 0.0) for k, v in after.commands.items()}
        return cls(n, after.wall - before.wall, after.turns - before.turns, cpu,
                   {k: v for k, v in commands.items() if v > 0}, after.leases - before.leases)  # fmt: skip

    @property
    def commands(self) -> float:
        return sum(self.commands_by_name.values())

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds

    @property
    def leases_per_s(self) -> float:
        return self.leases / self.seconds

    @property
    def cores(self) -> dict[str, float]:
        return {r: v / self.seconds for r, v in self.cpu_s.items()}

    @property
    def control_plane_cores(self) -> float:
        return sum(self.cpu_s.values()) / self.seconds

    def as_json(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "seconds": self.seconds,
            "turns_per_s": self.turns_per_s,
            "cores_by_role": self.cores,
            "control_plane_cores": self.control_plane_cores,
            "control_plane_cpu_ms_per_turn": 1000 * sum(self.cpu_s.values()) / self.turns if self.turns else None,
            "redis_ops_per_s": self.commands / self.seconds,
            "redis_commands_by_name": self.commands_by_name,
            "leases_per_s": self.leases_per_s,
            "leases_per_turn": self.leases / self.turns if self.turns else None,
        }


def measure_window(
    stack: fleet.Fleet,
    n: int,
    warmup_s: float,
    window_s: float,
    job: str,
    classes: Sequence[workload.EpisodeClass] | None = None,
) -> Window:
    """``n`` episodes of ``classes`` (default the fleet's workload) kept in flight (the fleet bench's
    submitter) for a warm-up, then a window. With episodes in flight, the warm-up lasts at least
    until the first turn and the window until it holds one (each at most ``WAIT_S`` longer): a loaded
    machine starts sandboxes slowly."""
    client = redis.Redis.from_url(stack.redis_url)
    try:
        with httpx.Client(base_url=stack.api, timeout=60.0) as http:
            submitter = fleet.Submitter(http, list(classes or stack.classes), job, n) if n else None
            hold = submitter.keep_up if submitter else time.sleep
            if submitter:
                submitter.submit(n)
                submitter.submit(n)
            hold(warmup_s)
            start = fleet.llm_calls(http, stack.workers)
            _hold_until_a_turn(http, stack, hold, start, wanted=submitter is not None)
            before = Sample.take(http, stack, client)
            hold(window_s)
            _hold_until_a_turn(http, stack, hold, before.turns, wanted=submitter is not None)
            after = Sample.take(http, stack, client)
            if submitter:
                submitter.cancel_all()
    finally:
        client.close()
    return Window.between(n, before, after)


WAIT_S = 120.0


def _hold_until_a_turn(
    http: httpx.Client, stack: fleet.Fleet, hold: Callable[[float], None], since: float, *, wanted: bool
) -> None:
    deadline = time.monotonic() + WAIT_S
    while wanted and fleet.llm_calls(http, stack.workers) <= since and time.monotonic() < deadline:
        hold(1.0)

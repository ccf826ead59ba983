"""The capacity model behind ``rollout bench capacity``: measured costs in, cores and Redis shards out.

Pure arithmetic (no I/O), so that it is tested on its own. Inputs are the costs one fleet run
measured (``Costs``); a scale is a multiple of the seed's fleet (24 engines, 384 sandboxes, about
75 turns/s). Per role, the CPU a fleet needs is its idle stack's CPU times the scale (every replica
set runs its own background loops: health checks, renewals, the reaper), plus turns/s x the role's
marginal CPU per turn, plus leases/s x its marginal CPU per lease (an episode's sandbox made and
removed, its task claimed, its trajectory written), divided by a target utilisation. Leases/s is
turns/s x the workload's leases per turn (1 / its mean turns). Redis needs its operations per
second over what one shard serves on one core (times the same utilisation), at least one shard.

The deployment's shape: the stateless roles (worker, proxy, broker, API) grow by replicas with the
scale (``seed_replicas`` x scale, one core each: one Python process per replica), Redis stays one
server unless sharded. The first component to saturate at a scale is the one most utilised in that
deployment; from the scale where it is Redis, only Redis Cluster shards keep up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

SEED_ENGINES = 24
SEED_SANDBOXES = 384
SEED_TURNS_PER_S = 75.0  # the seed's fleet: 384 episodes in flight at the field's pace
SCALE_FACTORS = (1, 10, 100)
REPLICATED = ("worker", "proxy", "broker", "api")  # stateless: grow by replicas
ROLES = (*REPLICATED, "redis")
SEED_REPLICAS = {"worker": 4, "proxy": 2, "broker": 2, "api": 2}  # k8s/base, one core each


@dataclass(frozen=True, slots=True)
class Costs:
    """What one fleet run measured; every figure is per role of ``ROLES`` where it is a mapping."""

    ms_per_turn: Mapping[str, float]  # marginal CPU ms per LLM turn (busy window minus idle window)
    idle_cores: Mapping[str, float]  # CPU cores of the stack with nothing in flight
    redis_ops_per_turn: float  # marginal Redis commands per turn (INFO commandstats)
    redis_idle_ops_per_s: float  # Redis commands per second of the idle stack
    leases_per_turn: float  # sandbox leases per turn of the workload in steady state
    shard_ops_per_s: float  # commands per second one Redis shard serves on one core, this mix
    ms_per_lease: Mapping[str, float] = field(default_factory=dict)  # marginal CPU ms per episode's lease
    redis_ops_per_lease: float = 0.0

    def cores_used(
        self, turns_per_s: float, factor: float = 1.0, leases_per_s: float | None = None
    ) -> dict[str, float]:
        """CPU cores each role uses (no headroom) at ``turns_per_s`` and ``leases_per_s`` (default: the
        workload's steady share of the turns) with the idle stack x ``factor``."""
        leases = self._leases(turns_per_s, leases_per_s)
        return {r: factor * self.idle_cores.get(r, 0.0)
                + (turns_per_s * self.ms_per_turn.get(r, 0.0) + leases * self.ms_per_lease.get(r, 0.0)) / 1000
                for r in ROLES}  # fmt: skip

    def redis_ops_per_s(self, turns_per_s: float, factor: float = 1.0, leases_per_s: float | None = None) -> float:
        leases = self._leases(turns_per_s, leases_per_s)
        return (factor * self.redis_idle_ops_per_s + turns_per_s * self.redis_ops_per_turn
                + leases * self.redis_ops_per_lease)  # fmt: skip

    def _leases(self, turns_per_s: float, leases_per_s: float | None) -> float:
        return turns_per_s * self.leases_per_turn if leases_per_s is None else leases_per_s


@dataclass(frozen=True, slots=True)
class Scale:
    factor: int
    turns_per_s: float
    engines: int
    sandboxes: int
    cores_by_role: dict[str, float]  # needed at the target utilisation
    cores_total: float
    redis_ops_per_s: float
    redis_shards: int
    leases_per_s: float
    utilisation_by_component: dict[str, float]  # in the deployment of this scale, one Redis shard
    first_to_saturate: str
    saturated: bool  # the first to saturate is already past the target utilisation


def per_turn_and_per_lease(
    busy: tuple[float, float, float], short: tuple[float, float, float] | None
) -> tuple[float, float]:
    """A marginal rate (CPU or commands per second over the idle stack's) split into a cost per turn
    and a cost per lease, from two windows ``(rate, turns/s, leases/s)``: ``busy``, the workload's
    episodes, and ``short``, episodes of a turn or two, which lease far more per turn. Two equations,
    two unknowns; where the exact answer has a negative part (noise), that part is 0 and the other
    is the least-squares fit over both windows. Without ``short``, all of it is per turn."""
    y1, t1, l1 = busy
    if short is None:
        return (max(0.0, y1) / t1 if t1 > 0 else 0.0), 0.0
    y2, t2, l2 = short
    det = t1 * l2 - t2 * l1
    per_turn = (y1 * l2 - y2 * l1) / det if det else -1.0
    per_lease = (t1 * y2 - t2 * y1) / det if det else -1.0
    if per_turn >= 0 and per_lease >= 0:
        return per_turn, per_lease
    by_turn = max(0.0, t1 * y1 + t2 * y2) / (t1 * t1 + t2 * t2) if t1 or t2 else 0.0
    by_lease = max(0.0, l1 * y1 + l2 * y2) / (l1 * l1 + l2 * l2) if l1 or l2 else 0.0
    if per_lease < 0 or not det:
        return by_turn, 0.0
    return 0.0, by_lease


def redis_shards(ops_per_s: float, shard_ops_per_s: float, utilisation: float) -> int:
    """Shards so that none runs past ``utilisation`` of what one serves; at least one."""
    if shard_ops_per_s <= 0:
        raise ValueError("shard_ops_per_s must be positive")
    return max(1, math.ceil(ops_per_s / (shard_ops_per_s * utilisation)))


def plan(
    costs: Costs, factor: int, utilisation: float = 0.7, seed_replicas: Mapping[str, int] = SEED_REPLICAS
) -> Scale:
    """The fleet ``factor`` times the seed's: what it needs and what saturates first."""
    if not 0 < utilisation <= 1:
        raise ValueError("utilisation must be in (0, 1]")
    turns = SEED_TURNS_PER_S * factor
    used = costs.cores_used(turns, factor)
    ops = costs.redis_ops_per_s(turns, factor)
    busy = {r: used[r] / (seed_replicas.get(r, 1) * factor) for r in REPLICATED}
    busy["redis"] = ops / costs.shard_ops_per_s
    first = max(busy, key=lambda r: busy[r])
    needed = {r: used[r] / utilisation for r in ROLES}
    return Scale(
        factor=factor,
        turns_per_s=turns,
        engines=SEED_ENGINES * factor,
        sandboxes=SEED_SANDBOXES * factor,
        cores_by_role=needed,
        cores_total=sum(needed.values()),
        redis_ops_per_s=ops,
        redis_shards=redis_shards(ops, costs.shard_ops_per_s, utilisation),
        leases_per_s=turns * costs.leases_per_turn,
        utilisation_by_component=busy,
        first_to_saturate=first,
        saturated=busy[first] > utilisation,
    )


def parse_replicas(text: str) -> dict[str, int]:
    """``worker=4,proxy=2`` -> replicas per role (roles left out keep the seed's)."""
    replicas = dict(SEED_REPLICAS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, _, count = part.partition("=")
        if role not in REPLICATED or not count.isdigit() or int(count) < 1:
            raise ValueError(f"bad replicas entry {part!r}: want ROLE=N with ROLE in {', '.join(REPLICATED)}")
        replicas[role] = int(count)
    return replicas

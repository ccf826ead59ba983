"""The capacity model's arithmetic (``services/benchmarks/capacity_model.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from services.benchmarks.capacity_model import (
    ROLES,
    Costs,
    parse_replicas,
    per_turn_and_per_lease,
    plan,
    redis_shards,
)

COSTS = Costs(
    ms_per_turn={"worker": 2.0, "proxy": 1.0, "broker": 1.5, "api": 0.1, "redis": 0.2},
    idle_cores={"worker": 0.01, "proxy": 0.02, "broker": 0.0, "api": 0.0, "redis": 0.0},
    redis_ops_per_turn=20.0,
    redis_idle_ops_per_s=10.0,
    leases_per_turn=0.02,
    shard_ops_per_s=50_000.0,
)


def test_cores_are_turns_times_cost_over_the_utilisation() -> None:
    seed = plan(COSTS, 1, utilisation=0.5)
    assert seed.turns_per_s == 75.0 and seed.engines == 24 and seed.sandboxes == 384
    assert seed.cores_by_role["worker"] == pytest.approx((0.01 + 75 * 2.0 / 1000) / 0.5)
    assert seed.cores_by_role["broker"] == pytest.approx(75 * 1.5 / 1000 / 0.5)
    assert seed.cores_total == pytest.approx(sum(seed.cores_by_role.values()))
    assert seed.redis_ops_per_s == pytest.approx(10 + 75 * 20)
    assert seed.leases_per_s == pytest.approx(1.5)


def test_everything_scales_linearly() -> None:
    seed, ten, hundred = (plan(COSTS, f) for f in (1, 10, 100))
    for role in ROLES:
        assert ten.cores_by_role[role] == pytest.approx(10 * seed.cores_by_role[role])
        assert hundred.cores_by_role[role] == pytest.approx(100 * seed.cores_by_role[role])
    assert hundred.redis_ops_per_s == pytest.approx(100 * seed.redis_ops_per_s)


def test_shards_round_up_and_are_at_least_one() -> None:
    assert redis_shards(0.0, 1000.0, 0.7) == 1
    assert redis_shards(700.0, 1000.0, 0.7) == 1
    assert redis_shards(701.0, 1000.0, 0.7) == 2
    assert plan(COSTS, 100, utilisation=0.7).redis_shards == 5  # 151,000 ops/s over 35,000 per shard
    with pytest.raises(ValueError):
        redis_shards(1.0, 0.0, 0.7)


def test_the_first_to_saturate_is_redis_once_the_stateless_roles_grow_by_replicas() -> None:
    seed = plan(COSTS, 1)
    assert seed.first_to_saturate == "broker" and not seed.saturated  # 2 replicas at 0.056 cores each
    hundred = plan(COSTS, 100)
    assert hundred.first_to_saturate == "redis" and hundred.saturated  # one server at 3.0x its capacity
    assert hundred.utilisation_by_component["redis"] == pytest.approx(151_000 / 50_000)
    assert hundred.utilisation_by_component["broker"] == pytest.approx(seed.utilisation_by_component["broker"])


def test_fewer_replicas_saturate_sooner() -> None:
    one_worker = plan(COSTS, 1, seed_replicas=parse_replicas("worker=1"))
    assert one_worker.first_to_saturate == "worker"
    assert one_worker.utilisation_by_component["worker"] == pytest.approx(0.01 + 0.15)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="ROLE=N"):
        parse_replicas("redis=3")
    with pytest.raises(ValueError):
        parse_replicas("worker=0")
    with pytest.raises(ValueError):
        plan(COSTS, 1, utilisation=0.0)


def test_a_lease_costs_on_top_of_the_turns_at_the_workloads_share() -> None:
    costs = dataclasses.replace(COSTS, ms_per_lease={"broker": 50.0}, redis_ops_per_lease=30.0)
    seed = plan(costs, 1, utilisation=0.5)
    assert seed.leases_per_s == pytest.approx(1.5)  # 75 turns/s x 0.02
    assert seed.cores_by_role["broker"] == pytest.approx((75 * 1.5 + 1.5 * 50.0) / 1000 / 0.5)
    assert seed.cores_by_role["worker"] == pytest.approx(plan(COSTS, 1, utilisation=0.5).cores_by_role["worker"])
    assert seed.redis_ops_per_s == pytest.approx(10 + 75 * 20 + 1.5 * 30)
    at = costs.cores_used(100.0, leases_per_s=4.0)  # the check's measured rates, not the steady share
    assert at["broker"] == pytest.approx((100 * 1.5 + 4.0 * 50.0) / 1000)


def test_two_windows_split_a_rate_into_per_turn_and_per_lease() -> None:
    per_turn, per_lease = 0.0012, 0.045  # CPU seconds

    def window(turns: float, leases: float) -> tuple[float, float, float]:
        return turns * per_turn + leases * per_lease, turns, leases

    assert per_turn_and_per_lease(window(80.0, 1.3), window(8.0, 4.0)) == pytest.approx((per_turn, per_lease))
    assert per_turn_and_per_lease(window(80.0, 1.3), None) == pytest.approx(((80 * per_turn + 1.3 * per_lease) / 80, 0))


def test_a_negative_part_from_noise_is_zero_and_the_other_fits_both_windows() -> None:
    # the short window cost less than its turns alone would: no per-lease cost, a per-turn fit
    per_turn, per_lease = per_turn_and_per_lease((0.10, 80.0, 1.0), (0.001, 8.0, 4.0))
    assert per_lease == 0.0 and per_turn == pytest.approx((80 * 0.10 + 8 * 0.001) / (80**2 + 8**2))
    # a role that works per lease only (more turns, less CPU): no per-turn cost
    per_turn, per_lease = per_turn_and_per_lease((0.01, 80.0, 1.0), (0.2, 8.0, 4.0))
    assert per_turn == 0.0 and per_lease == pytest.approx((1 * 0.01 + 4 * 0.2) / (1 + 16))
    assert per_turn_and_per_lease((0.5, 10.0, 1.0), (1.0, 20.0, 2.0)) == pytest.approx((0.05, 0.0))  # collinear

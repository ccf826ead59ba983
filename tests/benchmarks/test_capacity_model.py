"""The capacity model's arithmetic (``services/benchmarks/capacity_model.py``)."""

from __future__ import annotations

import pytest

from services.benchmarks.capacity_model import ROLES, Costs, parse_replicas, plan, redis_shards

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

"""``rollout bench swe``'s figures from trajectories: both routes, and an infra error counted as 0 only
for the attacks meant to cause one (a fork bomb, a disk filler), as 1 for every other attack."""

from __future__ import annotations

from typing import Any

from services.benchmarks import swe
from services.benchmarks.attacks import EXHAUSTION
from services.protocol.status import Status
from services.protocol.trajectory import Trajectory
from tests.trainer.factories import make_trajectory


def _results(overrides: dict[tuple[str, str], Trajectory] | None = None) -> dict[str, dict[str, list[Trajectory]]]:
    def one(mode: str) -> Trajectory:
        return make_trajectory("t1", reward=1.0 if mode == "gold" else 0.0)

    found = {route: {mode: [one(mode)] for mode in (*swe.MODES, *swe.ATTACKS)} for route in swe.ROUTES}
    for (route, mode), traj in (overrides or {}).items():
        found[route][mode] = [traj]
    return found


def _expected(figures: dict[str, Any]) -> bool:
    return swe._as_expected(figures, "", attacks=True)


def test_every_attack_on_both_routes_scoring_0_is_as_expected() -> None:
    figures = swe.summary(_results(), [1.0])
    assert len(swe.ATTACKS) >= 14 and set(EXHAUSTION) <= set(swe.ATTACKS)
    assert figures["attack_rewards"]["conftest"] == {"swe": 0.0, "plain": 0.0}
    assert (figures["gold_reward_mean"], figures["plain_gold_reward_mean"], figures["plain_noop_reward_mean"]) == (
        1.0, 1.0, 0.0)  # fmt: skip
    assert (figures["attack_reward_max"], figures["infra_errors"], figures["attack_infra_errors"]) == (0.0, 0, 0)
    assert _expected(figures)


def test_an_infra_error_counts_0_only_where_the_attack_is_meant_to_cause_one() -> None:
    infra = make_trajectory("t1", status=Status.INFRA_ERROR)
    figures = swe.summary(_results({("plain", "fork-bomb"): infra, ("swe", "disk-filler"): infra}), [1.0])
    assert (figures["attack_reward_max"], figures["infra_errors"], figures["attack_infra_errors"]) == (0.0, 0, 2)
    assert _expected(figures)

    figures = swe.summary(_results({("plain", "conftest"): infra}), [1.0])
    assert figures["attack_rewards"]["conftest"] == {"swe": 0.0, "plain": 1.0}
    assert (figures["attack_reward_max"], figures["infra_errors"]) == (1.0, 1)
    assert not _expected(figures)


def test_a_wrong_reward_on_the_plain_route_fails_the_run() -> None:
    figures = swe.summary(_results({("plain", "gold"): make_trajectory("t1", reward=0.0)}), [1.0])
    assert figures["plain_gold_reward_mean"] == 0.0 and not _expected(figures)
    figures = swe.summary(_results({("plain", "skip-markers"): make_trajectory("t1", reward=1.0)}), [1.0])
    assert figures["attack_reward_max"] == 1.0 and not _expected(figures)

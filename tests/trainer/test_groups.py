"""Group assembly: infra members removed, small and zero-variance groups counted, staleness, duplicates."""

from __future__ import annotations

import time

import pytest

from services.protocol.status import Status
from services.protocol.trajectory import Trajectory
from tests.trainer.factories import make_trajectory
from trainer_client.groups import Drop, GroupAssembler
from trainer_client.versions import Lineage, Unresolved

pytestmark = [pytest.mark.trainer]


def feed(asm: GroupAssembler, trajs: list[Trajectory], version: int = 0) -> None:
    for i, t in enumerate(trajs):
        asm.add(f"{i}-0", t, version)


def test_complete_group_is_ready_and_incomplete_is_not() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    feed(asm, [make_trajectory("a", i, reward=float(i % 2)) for i in range(4)])
    feed(asm, [make_trajectory("b", 0)])
    assert asm.ready_count == 1
    [group] = asm.take(5, version=0)
    assert group.group_id == "a" and len(group.members) == 4
    assert [d.fate for d in asm.drain_decided()] == ["used"] * 4


def test_infra_error_members_removed_not_scored_zero() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    trajs = [make_trajectory("a", i, reward=float(i % 2)) for i in range(4)]
    trajs[2] = make_trajectory("a", 2, status=Status.INFRA_ERROR, reward=0.0)
    feed(asm, trajs)
    [group] = asm.take(1, version=0)
    assert sorted(m.trajectory.sample_index for m in group.members) == [0, 1, 3]
    assert group.rewards().tolist() == [0.0, 1.0, 1.0]
    assert asm.drops[Drop.INFRA_ERROR] == 1


def test_group_below_min_valid_dropped_and_counted() -> None:
    asm = GroupAssembler(min_valid=3, max_staleness=1)
    feed(asm, [make_trajectory("a", i, reward=float(i), status=Status.INFRA_ERROR if i < 2 else Status.COMPLETED)
               for i in range(4)])  # fmt: skip
    assert asm.ready_count == 0
    assert asm.dropped_groups[Drop.GROUP_TOO_SMALL] == 1
    assert asm.drops == {Drop.INFRA_ERROR: 2, Drop.GROUP_TOO_SMALL: 2}
    assert len(asm.drain_decided()) == 4  # every entry decided, so every entry gets acknowledged


def test_zero_variance_group_counted_no_gradient() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    feed(asm, [make_trajectory("a", i, reward=1.0) for i in range(4)])
    assert asm.take(1, version=0) == []
    assert asm.dropped_groups[Drop.ZERO_VARIANCE] == 1


def test_stale_member_dropped_on_arrival() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=2, lineage=Lineage(spans={1: [1, 5]}))
    trajs = [make_trajectory("a", i, reward=float(i % 2), version="5-e1" if i else "2-e1") for i in range(4)]
    feed(asm, trajs, version=5)  # sample 0 is 3 versions old
    [group] = asm.take(1, version=5)
    assert len(group.members) == 3 and asm.drops[Drop.STALE] == 1


def test_rejected_members_decided_only_with_their_group() -> None:
    """An infra member of an open group is not acknowledged before its group is settled."""
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    feed(asm, [make_trajectory("a", 0, status=Status.INFRA_ERROR), make_trajectory("a", 1, reward=0.0)])
    assert asm.drain_decided() == []
    feed(asm, [make_trajectory("a", i, reward=1.0) for i in (2, 3)])
    asm.take(1, version=0)
    assert sorted(d.fate for d in asm.drain_decided()) == ["infra_error", "used", "used", "used"]


def test_carried_group_rechecked_for_staleness_when_taken() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1, lineage=Lineage(spans={1: [1, 3]}))
    feed(asm, [make_trajectory("a", i, reward=float(i % 2), version="0") for i in range(4)])
    feed(asm, [make_trajectory("b", i, reward=float(i % 2), version="1-e1") for i in range(4)], version=1)
    assert [g.group_id for g in asm.take(1, version=1)] == ["a"]  # oldest first; b carries over
    assert [g.group_id for g in asm.take(1, version=3)] == []  # b is now 2 versions old
    assert asm.drops[Drop.STALE] == 4 and asm.dropped_groups[Drop.GROUP_TOO_SMALL] == 1


def test_unknown_version_dropped() -> None:
    asm = GroupAssembler(min_valid=1, max_staleness=1)
    feed(asm, [make_trajectory("a", 0, version="base", group_size=1)])
    feed(asm, [make_trajectory("b", 0, version="3", group_size=1)])  # a bare step number names no weights
    assert asm.drops[Drop.UNKNOWN_VERSION] == 2


def test_weights_no_checkpoint_kept_are_orphaned() -> None:
    """Epoch 1 posted step 3 and died before checkpointing it; epoch 2 resumed from step 2."""
    lineage = Lineage(spans={1: [1, 2], 2: [3, 4]})
    asm = GroupAssembler(min_valid=2, max_staleness=5, lineage=lineage)
    versions = ["3-e1", "2-e1", "3-e2", "4-e2"]  # 3-e1: the lost weights
    feed(asm, [make_trajectory("a", i, reward=float(i % 2), version=v) for i, v in enumerate(versions)], version=4)
    [group] = asm.take(1, version=4)
    assert sorted(m.version for m in group.members) == [2, 3, 4]
    assert asm.drops == {Drop.ORPHANED: 1}
    with pytest.raises(Unresolved):
        Lineage(spans={1: [1, 2]}).step_of("2-e2")


def test_duplicates_dropped_and_counted() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    t0 = make_trajectory("a", 0, reward=1.0)
    feed(asm, [t0, t0, make_trajectory("a", 0, attempt=2)])  # same key; same trajectory, new attempt
    feed(asm, [make_trajectory("a", i, reward=0.0) for i in (1, 2, 3)])
    [group] = asm.take(1, version=0)
    assert len(group.members) == 4
    asm.add("9-0", t0, 0)  # after use
    assert asm.drops[Drop.DUPLICATE] == 3


def test_seen_keys_survive_a_restart() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1, seen={"r1:a:0#1"})
    asm.add("1-0", make_trajectory("a", 0), 0)
    assert asm.drops[Drop.DUPLICATE] == 1 and not asm.open


def test_an_incomplete_group_never_blocks_a_complete_one() -> None:
    """The trainer does not wait for the slowest trajectory: a later complete group is taken first."""
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    feed(asm, [make_trajectory("slow", i, reward=float(i % 2)) for i in range(3)])  # one member still running
    feed(asm, [make_trajectory("fast", i, reward=float(i % 2)) for i in range(4)])
    assert [g.group_id for g in asm.take(1, version=0)] == ["fast"]
    assert "slow" in asm.open


def test_a_group_missing_a_member_expires_and_late_members_are_dropped() -> None:
    asm = GroupAssembler(min_valid=2, max_staleness=1, group_timeout_s=60)
    feed(asm, [make_trajectory("a", i, reward=float(i % 2)) for i in range(3)])
    assert asm.expire(now=time.monotonic() + 30) == 0
    assert asm.expire(now=time.monotonic() + 61) == 1 and asm.expired_groups == 1
    [group] = asm.take(1, version=0)
    assert len(group.members) == 3
    asm.add("9-0", make_trajectory("a", 3, reward=1.0), 0)  # the straggler arrives after all
    assert asm.drops[Drop.DUPLICATE] == 1


def test_evaluation_samples_never_join_a_group() -> None:
    """The platform publishes them to the eval stream; one that reached this stream anyway is dropped."""
    asm = GroupAssembler(min_valid=2, max_staleness=1)
    trajs = [make_trajectory("a", i, reward=float(i % 2)) for i in range(4)]
    for t in trajs[:2]:
        t.mode = "eval"
    feed(asm, trajs)
    assert asm.ready_count == 0 and asm.drops[Drop.EVALUATION] == 2
    feed(asm, [make_trajectory("a", i, reward=float(i % 2), attempt=2) for i in range(2)])
    [group] = asm.take(1, version=0)
    assert all(m.trajectory.mode == "train" for m in group.members) and len(group.members) == 4

"""GRPO group assembly: trajectories in, complete groups out, every rejection counted.

Weight versions are integer step numbers written as strings ("0" = initial weights, "k" = the
weights after optimizer step k). The staleness of a trajectory is the trainer's current version
minus the oldest version that generated any of its turns.

Rules, in order, for each trajectory added:

1. a repeated ``(trajectory_id, attempt)`` (or a second record for a trajectory already held) is
   dropped as ``duplicate``;
2. ``infra_error`` and ``cancelled`` members are removed from their group (never scored as 0);
3. a member whose version is not an integer is dropped as ``unknown_version``; one older than
   ``max_staleness`` versions is dropped as ``stale`` (checked again when the group is taken);
4. a group is complete when all ``group_size`` members have arrived (in whatever state), or
   when it has waited ``group_timeout_s`` (settled with what arrived; later members are
   dropped as duplicates); with
   fewer than ``min_valid`` valid members it is dropped (``group_too_small``); with zero reward
   variance it is counted (``zero_variance``) and gives no gradient; otherwise it is ready.

Every trajectory ends up *decided* exactly once (used in a step, or dropped): the stream
consumer acknowledges decided entries after the checkpoint that follows.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from services.protocol.status import Status
from services.protocol.trajectory import Trajectory
from trainer_client.grpo import is_zero_variance


class Drop(StrEnum):
    """Why a trajectory did not reach the loss."""

    DUPLICATE = "duplicate"
    INFRA_ERROR = "infra_error"
    CANCELLED = "cancelled"
    STALE = "stale"
    UNKNOWN_VERSION = "unknown_version"
    GROUP_TOO_SMALL = "group_too_small"
    ZERO_VARIANCE = "zero_variance"
    MALFORMED = "malformed"  # the stream entry could not be decoded


@dataclass(frozen=True)
class Member:
    entry_id: str  # the stream entry that carried it
    trajectory: Trajectory
    version: int  # oldest weight version among its turns


@dataclass
class Group:
    group_id: str
    size: int
    opened_at: float = 0.0  # monotonic time of the first member
    arrived: set[str] = field(default_factory=set)  # trajectory ids seen (valid or not)
    members: list[Member] = field(default_factory=list)  # valid, trainable members
    rejected: list[tuple[Member, Drop]] = field(default_factory=list)  # decided with the group

    @property
    def complete(self) -> bool:
        return len(self.arrived) >= self.size

    def rewards(self) -> torch.Tensor:
        return torch.tensor([m.trajectory.trainable_reward for m in self.members], dtype=torch.float32)


@dataclass(frozen=True)
class Decided:
    entry_id: str
    key: str  # "trajectory_id#attempt"
    fate: str  # "used" or a Drop value


def key_of(traj: Trajectory) -> str:
    return f"{traj.trajectory_id}#{traj.attempt}"


def oldest_version(traj: Trajectory) -> int | None:
    """The oldest weight version of the trajectory's turns (0 with no turns); None if not an integer."""
    try:
        return min((int(t.weight_version) for t in traj.turns), default=0)
    except ValueError:
        return None


class GroupAssembler:
    """Collects trajectories into GRPO groups; hands out complete groups oldest-first."""

    def __init__(
        self, min_valid: int, max_staleness: int, seen: set[str] | None = None, group_timeout_s: float = 3600.0
    ) -> None:
        self.min_valid = min_valid
        self.max_staleness = max_staleness
        self.group_timeout_s = group_timeout_s
        self.closed: set[str] = set()  # group ids that left ``open``: a later member is a duplicate
        self.seen: set[str] = set(seen or ())  # keys already decided (persisted across restarts)
        self.held: set[str] = set()  # keys held in open or ready groups
        self.open: dict[str, Group] = {}
        self.ready: OrderedDict[str, Group] = OrderedDict()
        self.drops: Counter[str] = Counter()
        self.dropped_groups: Counter[str] = Counter()
        self.expired_groups = 0  # settled with members missing after ``group_timeout_s``
        self.decided: list[Decided] = []

    def add(self, entry_id: str, traj: Trajectory, version: int) -> None:
        """Take one trajectory read from the stream while the trainer is at ``version``."""
        key = key_of(traj)
        group = self.open.get(traj.group_id)
        if key in self.seen or key in self.held or (group and traj.trajectory_id in group.arrived):
            self._decide(entry_id, key, Drop.DUPLICATE)
            return
        if group is None:
            if traj.group_id in self.closed:  # a late member of a settled group
                self._decide(entry_id, key, Drop.DUPLICATE)
                return
            group = self.open[traj.group_id] = Group(traj.group_id, traj.group_size, opened_at=time.monotonic())
        group.arrived.add(traj.trajectory_id)
        member = Member(entry_id, traj, oldest_version(traj) or 0)
        self.held.add(key)
        reason = self._rejection(traj, version)
        if reason is None:
            group.members.append(member)
        else:
            group.rejected.append((member, reason))
        if group.complete:
            self._close(group)

    def expire(self, now: float | None = None) -> int:
        """Settle open groups waiting longer than ``group_timeout_s`` with the members they have.

        A member lost on the platform side must not hold its group (and its entries) forever.
        """
        now = time.monotonic() if now is None else now
        old = [g for g in self.open.values() if now - g.opened_at > self.group_timeout_s]
        for group in old:
            self.expired_groups += 1
            self._close(group)
        return len(old)

    def reject_entry(self, entry_id: str) -> None:
        """An undecodable stream entry: decided at once (acknowledged with the next checkpoint)."""
        self._decide(entry_id, f"entry:{entry_id}", Drop.MALFORMED)

    def take(self, n: int, version: int) -> list[Group]:
        """Up to ``n`` ready groups, oldest first, re-checked for staleness at ``version``; the rest carry over."""
        taken: list[Group] = []
        while self.ready and len(taken) < n:
            _, group = self.ready.popitem(last=False)
            fresh = [m for m in group.members if version - m.version <= self.max_staleness]
            group.rejected += [(m, Drop.STALE) for m in group.members if m not in fresh]
            group.members = fresh
            if self._usable(group):
                self._flush_rejected(group)
                for m in group.members:
                    self._release(m, "used")
                taken.append(group)
        return taken

    def drain_decided(self) -> list[Decided]:
        out, self.decided = self.decided, []
        return out

    @property
    def ready_count(self) -> int:
        return len(self.ready)

    def _rejection(self, traj: Trajectory, version: int) -> Drop | None:
        if traj.status is Status.INFRA_ERROR:
            return Drop.INFRA_ERROR
        if not traj.status.trainable:
            return Drop.CANCELLED
        oldest = oldest_version(traj)
        if oldest is None:
            return Drop.UNKNOWN_VERSION
        if version - oldest > self.max_staleness:
            return Drop.STALE
        return None

    def _close(self, group: Group) -> None:
        del self.open[group.group_id]
        self.closed.add(group.group_id)
        if self._usable(group):
            self.ready[group.group_id] = group

    def _usable(self, group: Group) -> bool:
        """Drop (and count) a group that is too small or has no reward variance."""
        reason: Drop | None = None
        if len(group.members) < self.min_valid:
            reason = Drop.GROUP_TOO_SMALL
        elif is_zero_variance(group.rewards()):
            reason = Drop.ZERO_VARIANCE
        if reason is None:
            return True
        self.dropped_groups[reason] += 1
        self._flush_rejected(group)
        for m in group.members:
            self._release(m, reason)
        group.members = []
        return False

    def _flush_rejected(self, group: Group) -> None:
        """Members rejected one by one are decided with their group, so a replay after a crash
        sees the whole group again (a group never waits for a member acknowledged earlier)."""
        for member, reason in group.rejected:
            self._release(member, reason)
        group.rejected = []

    def _release(self, member: Member, fate: str) -> None:
        key = key_of(member.trajectory)
        self.held.discard(key)
        self._decide(member.entry_id, key, fate)

    def _decide(self, entry_id: str, key: str, fate: str) -> None:
        if fate != "used":
            self.drops[fate] += 1
        self.seen.add(key)
        self.decided.append(Decided(entry_id, key, fate))

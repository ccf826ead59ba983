"""The leader's side of the loop: rollout supply, stream reading, group assembly, decisions and acks.

Only rank 0 holds a :class:`Feed` (see :mod:`trainer_client.ranks` for why one consumer).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from rollout_client.http import RolloutClient
from rollout_client.stream import Entry, TrajectoryConsumer
from services.runtime.sync_redis import open_sync_redis
from trainer_client.checkpoint import TrainerState
from trainer_client.groups import Group, GroupAssembler
from trainer_client.settings import TrainSettings
from trainer_client.supply import Admission, RolloutSupply, load_tasks


@dataclass
class Feed:
    settings: TrainSettings
    consumer: TrajectoryConsumer
    assembler: GroupAssembler
    supply: RolloutSupply | None = None
    backlog: list[Entry] = field(default_factory=list)  # reclaimed entries, consumed first
    _drops_seen: Counter[str] = field(default_factory=Counter)
    _groups_seen: Counter[str] = field(default_factory=Counter)
    sft_steps: int = 0  # optimizer steps that trained on no group (the SFT phase)

    @classmethod
    def start(cls, s: TrainSettings, state: TrainerState, client: RolloutClient | None) -> Feed:
        """Acknowledge what the checkpoint decided, reclaim the rest, restore the counters."""
        consumer = TrajectoryConsumer(open_sync_redis(s.require_redis_url()), s.job, s.consumer_group)
        consumer.ensure_group()
        consumer.ack(state.to_ack)  # a crash between checkpoint and ack
        assembler = GroupAssembler(s.min_valid, s.max_staleness, seen=state.seen(), group_timeout_s=s.group_timeout_s,
                                   lineage=state.lineage)  # fmt: skip
        feed = cls(s, consumer, assembler, _supply(s, client), backlog=consumer.reclaim())
        for counters in (feed._drops_seen, assembler.drops):
            counters.update(state.drops)
        for counters in (feed._groups_seen, assembler.dropped_groups):
            counters.update(state.dropped_groups)
        if feed.supply:
            feed.supply.requested = state.requested_groups
        feed.sft_steps = state.sft_steps
        return feed

    def finished_groups(self, step: int) -> int:
        return (step - self.sft_steps) * self.settings.batch_groups + sum(self.assembler.dropped_groups.values())

    def top_up(self, step: int) -> None:
        if self.supply:
            self.supply.top_up(self.finished_groups(step))

    def gather(self, step: int) -> list[Group]:
        """Read until ``batch_groups`` complete groups are ready (or the wait times out); take them."""
        s = self.settings
        deadline = time.monotonic() + s.wait_timeout_s
        self.top_up(step)
        while self.assembler.ready_count < s.batch_groups and time.monotonic() < deadline:
            entries, self.backlog = self.backlog, []
            for entry in entries or self.consumer.read(s.read_count, s.read_block_ms):
                if entry.trajectory is None:
                    self.assembler.reject_entry(entry.entry_id)
                else:
                    self.assembler.add(entry.entry_id, entry.trajectory, step)
            self.assembler.expire()
            self.top_up(step)  # dropped groups free admission slots
        return self.assembler.take(s.batch_groups, step) if self.assembler.ready_count >= s.batch_groups else []

    def decide(self, state: TrainerState) -> None:
        """Record every decided entry in the state (acknowledged after the next checkpoint)."""
        for d in self.assembler.drain_decided():
            if d.fate == "used":
                state.used.append(d.key)
            else:
                state.dropped[d.key] = d.fate
            state.to_ack.append(d.entry_id)

    def snapshot(self, state: TrainerState) -> None:
        """Counters and positions into the state, just before it is saved."""
        state.last_entry_id = self.consumer.last_entry_id
        state.requested_groups = self.supply.requested if self.supply else 0
        state.drops = dict(self.assembler.drops)
        state.dropped_groups = dict(self.assembler.dropped_groups)

    def new_drops(self) -> tuple[dict[str, int], dict[str, int]]:
        """Trajectory and group drops since the last call."""
        drops = dict(self.assembler.drops - self._drops_seen)
        groups = dict(self.assembler.dropped_groups - self._groups_seen)
        self._drops_seen, self._groups_seen = Counter(self.assembler.drops), Counter(self.assembler.dropped_groups)
        return drops, groups

    def in_flight(self, step: int) -> int:
        return self.supply.in_flight(self.finished_groups(step)) if self.supply else 0

    def close(self) -> None:
        if self.supply:
            self.supply.client.close()
        self.consumer.client.close()


def _supply(s: TrainSettings, client: RolloutClient | None) -> RolloutSupply | None:
    if client is None:
        return None
    if not s.tasks_path:
        raise ValueError("ROLLOUT_TRAIN_TASKS_PATH is required with ROLLOUT_TRAIN_API_URL")
    admission = Admission(s.batch_groups, s.max_staleness, s.overprovision)
    return RolloutSupply(client, s.job, load_tasks(s.tasks_path), admission, s.group_size, s.sampling, s.limits)

"""The trainer's parts wired together: stream -> groups -> GRPO step -> export/sync -> checkpoint -> ack."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import redis

from trainer_client import checkpoint
from trainer_client.batch import Sample, micro_batches, samples_from_groups, staleness_histogram
from trainer_client.client import RolloutClient
from trainer_client.consumer import Entry, TrajectoryConsumer
from trainer_client.export import export_hf
from trainer_client.groups import Group, GroupAssembler
from trainer_client.hf_import import load_hf_weights
from trainer_client.learner import Learner, StepStats
from trainer_client.metrics import StepLog, StepRecord, StepTimer, TrainerMetrics
from trainer_client.model import Policy, build_gpt, build_policy, device
from trainer_client.pipeline import Admission, RolloutSupply, load_tasks
from trainer_client.settings import TrainSettings
from trainer_client.shards import full_state_dict
from trainer_client.weights import WeightPublisher, job_pool

logger = logging.getLogger(__name__)


@dataclass
class Trainer:
    settings: TrainSettings
    policy: Policy
    learner: Learner
    consumer: TrajectoryConsumer
    assembler: GroupAssembler
    state: checkpoint.TrainerState
    log: StepLog
    metrics: TrainerMetrics
    supply: RolloutSupply | None = None
    publisher: WeightPublisher | None = None
    backlog: list[Entry] = field(default_factory=list)  # reclaimed entries, consumed first
    _drops_seen: Counter[str] = field(default_factory=Counter)
    _groups_seen: Counter[str] = field(default_factory=Counter)

    @classmethod
    def start(cls, s: TrainSettings) -> Trainer:
        """Build the policy, resume from the latest checkpoint, acknowledge what it decided, reclaim the rest."""
        policy = build_policy(s.model, s.parallel, s.optim)
        ckpt = checkpoint.latest(s.checkpoint_dir)
        if s.init_from:  # version "0": the weights the engines start with (the KL reference too)
            load_hf_weights(policy.module, s.init_from, s.model)
        reference = _reference(policy, s) if s.loss.kl_coef > 0 else None
        state = checkpoint.load(ckpt, policy) if ckpt else checkpoint.TrainerState()
        consumer = TrajectoryConsumer(redis.Redis.from_url(s.require_redis_url()), s.job, s.consumer_group)
        client = RolloutClient(s.api_url, s.api_token) if s.api_url else None
        consumer.ensure_group()
        consumer.ack(state.to_ack)  # a crash between checkpoint and ack
        assembler = GroupAssembler(s.min_valid, s.max_staleness, seen=state.seen(), group_timeout_s=s.group_timeout_s)
        learner, supply, publisher = Learner(policy, s.loss, reference), _supply(s, client), _publisher(s, client)
        trainer = cls(s, policy, learner, consumer, assembler, state, StepLog(s.step_log), TrainerMetrics(),
                      supply, publisher, backlog=consumer.reclaim())  # fmt: skip
        trainer._drops_seen.update(state.drops)
        trainer._groups_seen.update(state.dropped_groups)
        assembler.drops.update(state.drops)
        assembler.dropped_groups.update(state.dropped_groups)
        if trainer.supply:
            trainer.supply.requested = state.requested_groups
        if s.metrics_port:
            trainer.metrics.serve(s.metrics_port)
        return trainer

    @property
    def version(self) -> int:
        return int(self.state.version)

    def finished_groups(self) -> int:
        return self.state.step * self.settings.batch_groups + sum(self.assembler.dropped_groups.values())

    def top_up(self) -> None:
        if self.supply:
            self.supply.top_up(self.finished_groups())

    def gather(self) -> list[Group]:
        """Read until ``batch_groups`` complete groups are ready (or the wait times out); take them."""
        deadline = time.monotonic() + self.settings.wait_timeout_s
        need = self.settings.batch_groups
        while self.assembler.ready_count < need and time.monotonic() < deadline:
            entries, self.backlog = self.backlog, []
            entries = entries or self.consumer.read(self.settings.read_count, self.settings.read_block_ms)
            for entry in entries:
                if entry.trajectory is None:
                    self.assembler.reject_entry(entry.entry_id)
                else:
                    self.assembler.add(entry.entry_id, entry.trajectory, self.version)
            self.assembler.expire()
            self.top_up()  # dropped groups free admission slots
        return self.assembler.take(need, self.version) if self.assembler.ready_count >= need else []

    def train(self, groups: list[Group]) -> tuple[list[Sample], StepStats]:
        s = self.settings
        samples = samples_from_groups(groups, self.version, s.loss.normalize_std, s.max_seq_len)
        stats = self.learner.step(micro_batches(samples, s.micro_batch_size, device()))
        self.state.step += 1
        self.state.version = str(self.state.step)
        return samples, stats

    def export_and_sync(self) -> bool | None:
        s = self.settings
        if self.state.step % s.export_every:
            return None
        export = export_hf(
            full_state_dict(self.policy.module), s.model, self.state.version, s.export_dir, s.tokenizer_dir
        )
        logger.info("exported version %s to %s (%.2fs)", export.version, export.path, export.seconds)
        return self.publisher.publish(export).ok if self.publisher else None

    def checkpoint(self, force: bool = False) -> None:
        """Record every decided entry, save, then acknowledge those entries."""
        for d in self.assembler.drain_decided():
            if d.fate == "used":
                self.state.used.append(d.key)
            else:
                self.state.dropped[d.key] = d.fate
            self.state.to_ack.append(d.entry_id)
        if not force and self.state.step % self.settings.checkpoint_every:
            return
        self.state.last_entry_id = self.consumer.last_entry_id
        self.state.requested_groups = self.supply.requested if self.supply else 0
        self.state.drops = dict(self.assembler.drops)
        self.state.dropped_groups = dict(self.assembler.dropped_groups)
        checkpoint.save(self.settings.checkpoint_dir, self.policy, self.state, self.settings.keep_checkpoints)
        self.consumer.ack(self.state.to_ack)
        self.state.to_ack = []

    def close(self) -> None:
        if self.supply:
            self.supply.client.close()
        if self.publisher:
            self.publisher.close()
        self.consumer.client.close()
        self.metrics.close()

    def record(
        self, groups: list[Group], samples: list[Sample], stats: StepStats, sync_ok: bool | None, timer: StepTimer
    ) -> StepRecord:
        timings = {**timer.record(), "recompute_s": stats.recompute_s, "update_s": stats.update_s}
        n = len(samples)
        record = StepRecord(
            step=self.state.step,
            version=self.state.version,
            groups=len(groups),
            trajectories=n,
            tokens=stats.tokens,
            reward_mean=sum(s.reward for s in samples) / n,
            response_len_mean=sum(len(s.loss_mask) for s in samples) / n,
            generated_len_mean=sum(float(s.loss_mask.sum()) for s in samples) / n,
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            clip_fraction=stats.clip_fraction,
            logprob_gap=stats.logprob_gap,
            ess=stats.ess,
            tis_mean=stats.tis_mean,
            kl=stats.kl,
            staleness=staleness_histogram(samples),
            drops=dict(self.assembler.drops - self._drops_seen),
            dropped_groups=dict(self.assembler.dropped_groups - self._groups_seen),
            carried_groups=self.assembler.ready_count,
            in_flight_groups=self.supply.in_flight(self.finished_groups()) if self.supply else 0,
            sync_ok=sync_ok,
            timings=timings,
        )
        self._drops_seen, self._groups_seen = Counter(self.assembler.drops), Counter(self.assembler.dropped_groups)
        self.log.append(record)
        self.metrics.observe(record)
        return record


def _supply(s: TrainSettings, client: RolloutClient | None) -> RolloutSupply | None:
    if client is None:
        return None
    if not s.tasks_path:
        raise ValueError("ROLLOUT_TRAIN_TASKS_PATH is required with ROLLOUT_TRAIN_API_URL")
    admission = Admission(s.batch_groups, s.max_staleness, s.overprovision)
    return RolloutSupply(client, s.job, load_tasks(s.tasks_path), admission, s.group_size, s.sampling, s.limits)


def _publisher(s: TrainSettings, client: RolloutClient | None) -> WeightPublisher | None:
    if not s.proxy_url:
        return None
    pool = job_pool(s.job, s.pool, client.job(s.job).pool if client else None)
    return WeightPublisher(s.proxy_url, pool, s.admin_token or None, s.sync_timeout_s, s.weight_store_url)


def _reference(policy: Policy, s: TrainSettings) -> object:
    """A frozen copy of the initial weights for the KL term."""
    reference = build_gpt(s.model, s.parallel)
    reference.load_state_dict(policy.module.state_dict())
    reference.eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference

"""The trainer's parts wired together, on every rank: batch broadcast -> GRPO step -> export/sync -> checkpoint.

The leader (rank 0) also holds the :class:`~trainer_client.feed.Feed` (stream, groups, acks), the
weight publisher and the step log; every other rank receives the step's samples from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rollout_client.errors import JobGone, job_gone
from rollout_client.http import RolloutClient
from rollout_client.weights import WeightPublisher, job_pool
from services.protocol.weights import version_label
from trainer_client import checkpoint
from trainer_client.batch import Sample, samples_from_groups, staleness_histogram
from trainer_client.evaluation import EvalRecord, Evaluator
from trainer_client.export import export_hf
from trainer_client.feed import Feed
from trainer_client.hf_import import load_hf_weights
from trainer_client.learner import Batching, Learner, StepStats
from trainer_client.metrics import StepLog, StepRecord, StepTimer, TrainerMetrics
from trainer_client.model import Policy, build_gpt, build_policy
from trainer_client.ranks import Ranks
from trainer_client.settings import TrainSettings
from trainer_client.sft import run_sft
from trainer_client.shards import full_state_dict
from trainer_client.supply import load_tasks
from trainer_client.versions import next_epoch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    groups: int
    samples: list[Sample]


@dataclass
class Trainer:
    settings: TrainSettings
    policy: Policy
    learner: Learner
    state: checkpoint.TrainerState
    ranks: Ranks
    feed: Feed | None = None  # the leader's
    publisher: WeightPublisher | None = None  # the leader's
    log: StepLog | None = None  # the leader's
    metrics: TrainerMetrics | None = None  # the leader's
    evaluator: Evaluator | None = None  # the leader's

    @classmethod
    def start(cls, s: TrainSettings) -> Trainer:
        """Build the policy, resume from the latest checkpoint with a new run epoch; the leader opens the feed."""
        policy = build_policy(s.model, s.parallel, s.optim)
        ranks = Ranks.current()
        if s.init_from:  # version "0": the weights the engines start with (the KL reference too)
            load_hf_weights(policy.module, s.init_from, s.model)
        reference = _reference(policy, s) if s.loss.kl_coef > 0 else None
        ckpt = checkpoint.latest(s.checkpoint_dir)
        state = checkpoint.load(ckpt, policy) if ckpt else checkpoint.TrainerState()
        state.epoch = ranks.broadcast(next_epoch(s.checkpoint_dir) if ranks.leader else None)
        batching = Batching(s.micro_batch_tokens, s.packing)
        learner = Learner(policy, s.loss, reference, ranks, batching, s.optim)
        trainer = cls(s, policy, learner, state, ranks)
        if ranks.leader:
            client = RolloutClient(s.api_url, s.api_token) if s.api_url else None
            trainer.feed = Feed.start(s, state, client)
            trainer.publisher = _publisher(s, client)
            trainer.log, trainer.metrics = StepLog(s.step_log), TrainerMetrics()
            if s.metrics_port:
                trainer.metrics.serve(s.metrics_port)
            trainer.evaluator = _evaluator(s)
        logger.info("rank %d/%d (dp %d/%d, tp %d/%d) at step %d, epoch %d", ranks.rank, ranks.world, ranks.dp_rank,
                    ranks.dp_size, ranks.tp_rank, ranks.tp_size, state.step, state.epoch)  # fmt: skip
        if ckpt and s.proxy_url:  # engines may serve weights this run lost: put the kept ones back first
            trainer.export_and_sync(force=True)
        if not ckpt:
            trainer.first_phase()
        return trainer

    def first_phase(self) -> None:
        """A fresh run: evaluate the initial weights; with demonstrations, SFT, post and evaluate its weights."""
        s = self.settings
        if s.evaluation.before_sft:
            self.evaluate("base")
        if s.sft.path is None:
            return
        result = run_sft(self.policy, s.sft, self.learner.batching, self.ranks)
        self.state.step = self.state.sft_steps = result.steps
        self.state.lineage.extend(self.state.epoch, self.state.step)
        self.state.version = version_label(self.state.step, self.state.epoch)
        if self.feed:
            self.feed.sft_steps = result.steps
        self.export_and_sync(force=True)
        self.checkpoint(force=True)
        self.evaluate("sft")

    @property
    def grpo_step(self) -> int:
        return self.state.step - self.state.sft_steps

    def evaluate(self, phase: str) -> EvalRecord | None:
        """Held-out pass@1 of the weights the engines serve now (leader; None elsewhere or when not configured)."""
        if self.evaluator is None:
            return None
        record = self.evaluator.evaluate(phase, self.state.step, self.grpo_step, self.state.version)
        with (self.settings.work_dir / "evals.jsonl").open("a") as f:
            f.write(record.model_dump_json() + "\n")
        return record

    def next_batch(self) -> Batch | None:
        """The leader gathers complete groups and makes the samples; every rank gets them (None: stop).
        A job gone from the store (``JobGone``) is raised on every rank, not only the leader's (the
        others would wait for its broadcast forever)."""
        batch: Batch | str | None = None
        if self.feed is not None:
            s = self.settings
            try:
                groups = self.feed.gather(self.state.step)
            except JobGone as exc:
                batch = str(exc)
            else:
                samples = samples_from_groups(groups, self.state.step, s.loss.normalize_std, s.max_seq_len)
                batch = Batch(len(groups), samples) if groups else None
        shared: Batch | str | None = self.ranks.broadcast(batch)
        if isinstance(shared, str):
            raise job_gone(self.settings.job, f"reading its trajectories: {shared}")
        return shared

    def train(self, batch: Batch) -> StepStats:
        # the learning-rate schedule (warm-up, decay) counts GRPO steps: SFT ran at its own constant rate
        stats = self.learner.step(batch.samples, self.grpo_step + 1)
        self.state.step += 1
        self.state.lineage.extend(self.state.epoch, self.state.step)
        self.state.version = version_label(self.state.step, self.state.epoch)
        return stats

    def export_and_sync(self, force: bool = False) -> bool | None:
        """Gather the shards (every tensor-parallel group of data-parallel rank 0), export and post (leader)."""
        s = self.settings
        if self.state.step % s.export_every and not force:
            return None
        if self.ranks.dp_rank != 0:
            return None
        state = full_state_dict(self.policy.module)
        if not self.ranks.leader:
            return None
        export = export_hf(state, s.model, self.state.version, s.export_dir, s.tokenizer_dir)
        logger.info("exported version %s to %s (%.2fs)", export.version, export.path, export.seconds)
        return self.publisher.publish(export).ok if self.publisher else None

    def checkpoint(self, force: bool = False) -> None:
        """Record every decided entry, save (all ranks), then acknowledge those entries (leader)."""
        if self.feed:
            self.feed.decide(self.state)
        if not force and self.state.step % self.settings.checkpoint_every:
            return
        if self.feed:
            self.feed.snapshot(self.state)
        checkpoint.save(self.settings.checkpoint_dir, self.policy, self.state, self.settings.keep_checkpoints,
                        self.ranks)  # fmt: skip
        if self.feed:
            self.feed.consumer.ack(self.state.to_ack)
            self.state.to_ack = []

    def close(self) -> None:
        if self.feed:
            self.feed.close()
        if self.publisher:
            self.publisher.close()
        if self.metrics:
            self.metrics.close()
        if self.evaluator:
            self.evaluator.close()

    def record(self, batch: Batch, stats: StepStats, sync_ok: bool | None, timer: StepTimer) -> StepRecord | None:
        """Every rank's timings to the leader, which writes the step's line (others get None)."""
        timings = {**timer.record(), "recompute_s": stats.recompute_s, "update_s": stats.update_s}
        per_rank = self.ranks.gather(timings)
        if self.feed is None or self.log is None or self.metrics is None:
            return None
        samples, n = batch.samples, len(batch.samples)
        drops, dropped_groups = self.feed.new_drops()
        record = StepRecord(
            step=self.state.step, version=self.state.version, groups=batch.groups, trajectories=n,
            tokens=stats.tokens, reward_mean=sum(s.reward for s in samples) / n,
            response_len_mean=sum(len(s.loss_mask) for s in samples) / n,
            generated_len_mean=sum(float(s.loss_mask.sum()) for s in samples) / n,
            loss=stats.loss, grad_norm=stats.grad_norm, clip_fraction=stats.clip_fraction,
            logprob_gap=stats.logprob_gap, ess=stats.ess, tis_mean=stats.tis_mean, kl=stats.kl, lr=stats.lr,
            padding_share=1 - stats.sequence_tokens / max(stats.slots, 1), staleness=staleness_histogram(samples),
            drops=drops, dropped_groups=dropped_groups, carried_groups=self.feed.assembler.ready_count,
            in_flight_groups=self.feed.in_flight(self.state.step), sync_ok=sync_ok, timings=timings,
            rank_timings=per_rank,
        )  # fmt: skip
        self.log.append(record)
        self.metrics.observe(record)
        return record


def _publisher(s: TrainSettings, client: RolloutClient | None) -> WeightPublisher | None:
    if not s.proxy_url:
        return None
    pool = job_pool(s.job, s.pool, client.job(s.job).pool if client else None)
    # the job's own token may update its own pool (the proxy checks it); an admin token may update any
    token = s.proxy_token or s.api_token or s.admin_token or None
    return WeightPublisher(s.proxy_url, pool, token, s.sync_timeout_s, s.weight_store_url)


def _evaluator(s: TrainSettings) -> Evaluator | None:
    e = s.evaluation
    if e.tasks_path is None or not s.api_url:
        return None
    return Evaluator(e, s.api_url, s.limits, load_tasks(e.tasks_path))


def _reference(policy: Policy, s: TrainSettings) -> object:
    """A frozen copy of the initial weights for the KL term."""
    reference = build_gpt(s.model, s.parallel)
    reference.load_state_dict(policy.module.state_dict())
    reference.eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference

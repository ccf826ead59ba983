"""``rollout-train``: asynchronous GRPO on a job's trajectory stream (settings: ``ROLLOUT_TRAIN_*``)."""

from __future__ import annotations

import logging

from rollout_client.errors import JobGone
from services.runtime.logs import configure_logging
from trainer_client.metrics import StepTimer
from trainer_client.plot import plot_steps
from trainer_client.settings import TrainSettings
from trainer_client.trainer import Trainer

logger = logging.getLogger("trainer_client")


def run(settings: TrainSettings) -> Trainer:
    """Train until ``max_steps`` (or no batch completes within ``wait_timeout_s``), then plot."""
    trainer = Trainer.start(settings)
    try:
        loop(trainer, settings)
    finally:
        trainer.close()
    if settings.plot and trainer.log and (records := trainer.log.read()):
        plot_steps(records, settings.work_dir / "steps.png")
    return trainer


def loop(trainer: Trainer, settings: TrainSettings) -> None:
    """Wait for complete groups, one GRPO step, export + sync, checkpoint, log; until max_steps (every rank)."""
    while trainer.grpo_step < settings.max_steps:
        timer = StepTimer()
        with timer.phase("wait_rollouts_s"):
            batch = trainer.next_batch()  # the leader reads the stream; every rank gets the samples
        if batch is None:
            logger.warning("no complete batch within %.0fs; stopping", settings.wait_timeout_s)
            break
        stats = trainer.train(batch)  # logprob recompute + actor update, timed inside
        with timer.phase("export_sync_s"):
            sync_ok = trainer.export_and_sync()
        with timer.phase("checkpoint_s"):
            trainer.checkpoint()
        if record := trainer.record(batch, stats, sync_ok, timer):
            logger.info("step %d (%s) reward %.3f gap %.4f ess %.3f time %.2fs", record.step, record.version,
                        record.reward_mean, record.logprob_gap, record.ess, record.timings["total_s"])  # fmt: skip
        if trainer.grpo_step % settings.evaluation.every == 0 or trainer.grpo_step == settings.max_steps:
            trainer.evaluate("grpo")
    trainer.checkpoint(force=True)


def main() -> None:
    settings = TrainSettings()
    configure_logging(settings.log_level)
    try:
        run(settings)
    except JobGone as exc:  # the store lost its state (or the job was removed): nothing more will come
        logger.error("stopping: %s", exc)
        raise SystemExit(2) from exc


if __name__ == "__main__":  # dist_checkpointing spawns processes: the guard is required
    main()

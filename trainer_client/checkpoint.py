"""Checkpoints: Megatron distributed checkpoint of model + optimizer, plus the trainer's own state.

Layout under the checkpoint directory::

    step_000004/model/            megatron dist_checkpointing (model and optimizer shards)
    step_000004/trainer_state.json step, weight version, epoch and lineage, decided keys, entries to ack, counters
    step_000004/rng.pt             torch and python RNG states (rank 0's)
    EPOCH                          the run-epoch counter (trainer_client.versions)
    latest                         name of the newest complete checkpoint

A checkpoint is written under ``step_N.tmp`` and renamed when complete, then ``latest`` is
replaced atomically: a crash mid-save leaves the previous checkpoint in charge.

dist_checkpointing starts a multiprocessing Manager on its first save: the program that saves
must run under an ``if __name__ == "__main__":`` guard, and psutil must be installed.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from trainer_client.cpu_shims import megatron_on_cpu
from trainer_client.model import Policy
from trainer_client.ranks import Ranks
from trainer_client.versions import Lineage

logger = logging.getLogger(__name__)

LATEST = "latest"


class TrainerState(BaseModel):
    """Everything besides the weights that a restarted trainer needs."""

    step: int = 0  # optimizer steps so far, the SFT phase's included
    sft_steps: int = 0  # of which the SFT phase took (GRPO step = step - sft_steps)
    version: str = "0"  # label of the current weights (trainer_client.versions)
    epoch: int = 0  # the run epoch that trained the latest step (a new one at every start)
    lineage: Lineage = Field(default_factory=Lineage)  # labels that name ancestors of these weights
    used: list[str] = Field(default_factory=list)  # "trajectory_id#attempt" in the order they were trained on
    dropped: dict[str, str] = Field(default_factory=dict)  # key -> drop reason
    to_ack: list[str] = Field(default_factory=list)  # stream entries decided up to this checkpoint
    last_entry_id: str = "0-0"  # the newest stream entry read (the group's position is in Redis)
    requested_groups: int = 0  # groups requested from the API so far (admission control)
    drops: dict[str, int] = Field(default_factory=dict)  # cumulative, by reason (trajectories)
    dropped_groups: dict[str, int] = Field(default_factory=dict)  # cumulative, by reason

    def seen(self) -> set[str]:
        return set(self.used) | set(self.dropped)


def _model_state(policy: Policy) -> dict[str, Any]:
    msd = policy.module.sharded_state_dict()
    return {"model": msd, "optimizer": policy.optimizer.sharded_state_dict(msd)}


def save(root: Path, policy: Policy, state: TrainerState, keep: int = 2, ranks: Ranks | None = None) -> Path:
    """Collective: every rank writes its shards; the leader writes the trainer state and renames."""
    from megatron.core import dist_checkpointing

    ranks = ranks or Ranks()
    final = root / f"step_{state.step:06d}"
    tmp = root / f"step_{state.step:06d}.tmp"
    if ranks.leader:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "model").mkdir(parents=True)
    ranks.barrier()
    with megatron_on_cpu():
        dist_checkpointing.save(_model_state(policy), str(tmp / "model"))
    ranks.barrier()
    if ranks.leader:
        _finish(root, tmp, final, state, keep)
    ranks.barrier()
    return final


def _finish(root: Path, tmp: Path, final: Path, state: TrainerState, keep: int) -> None:
    (tmp / "trainer_state.json").write_text(state.model_dump_json())
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _write_atomic(root / LATEST, final.name)
    _prune(root, keep)
    logger.info("checkpoint %s written", final)


def latest(root: Path) -> Path | None:
    marker = root / LATEST
    if not marker.exists():
        return None
    path = root / marker.read_text().strip()
    return path if path.exists() else None


def load(path: Path, policy: Policy) -> TrainerState:
    """Load weights, optimizer state and RNG into ``policy``; return the trainer state."""
    from megatron.core import dist_checkpointing

    with warnings.catch_warnings(), megatron_on_cpu():  # torch's own deprecations inside megatron's loader
        warnings.simplefilter("ignore", FutureWarning)
        loaded = dist_checkpointing.load(_model_state(policy), str(path / "model"))
        policy.module.load_state_dict(loaded["model"])
        policy.optimizer.load_state_dict(loaded["optimizer"])
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    logger.info("resumed from %s", path)
    return TrainerState.model_validate_json((path / "trainer_state.json").read_text())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp"))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)

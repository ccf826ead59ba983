"""TRL's recipe on a whole local fleet: the real ``GRPOTrainer`` trains a tiny byte-level Llama on CPU
through the platform (``rollout_client.trl``), and every step is recorded for checking and figures.

The fleet is the demo's launcher (Redis, one torch engine, the proxy, the broker with local sandboxes,
the API, a worker). Each optimizer step: TRL's ``rollout_func`` runs the step's prompts as platform
tasks, TRL trains on the returned trajectories, the callback posts the new weights through the proxy's
transaction. Used by ``rollout bench trainers`` and by ``tests/rollout_client/test_trl.py``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.protocol.agents import BashAgent
from services.protocol.tasks import AgentLimits, RewardSpec, Task

AGENT = BashAgent(system_template="Reply with one bash block.", instance_template="{{task}}")
LIMITS = AgentLimits(max_turns=2, max_tokens_per_turn=12, command_timeout_s=5)
PROMPTS = ("Write the number 7 to answer.txt", "Print the date")


def random_reward_task(prompt: str) -> Task:
    """A reward that varies between samples (a random byte): the plumbing is measured, not learning
    (a random tiny policy never writes a bash block)."""
    reward = RewardSpec(command="od -An -N1 -tu1 /dev/urandom", parse_float=True, timeout_s=10)
    return Task(id="t", prompt=prompt, reward=reward)


@dataclass
class Recipe:
    steps: int = 3
    prompts: tuple[str, ...] = PROMPTS  # the dataset; every step takes all of them
    num_generations: int = 4
    make_task: Callable[[str], Task] = random_reward_task
    reruns: int = 1
    max_attempts: int = 1


@dataclass
class RecipeRun:
    """What happened, step by step (``batches``: TRL's loss inputs with the samples that made them)."""

    batches: list[dict[str, Any]] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    wait_s: float = 0.0  # inside rollout_func: waiting on the platform
    train_s: float = 0.0  # trainer.train() from start to end
    versions_posted: list[str] = field(default_factory=list)
    posts_ok: bool = True
    published: dict[str, Any] = field(default_factory=dict)  # trajectory id -> the stream's own record
    global_step: int = 0


def start_fleet(root: Path) -> Any:
    from services.fleet.demo import ModelShape, initial_model
    from services.fleet.launcher import Fleet, FleetConfig

    model = initial_model(root / "model", ModelShape(hidden=32, layers=2, heads=4, kv_heads=2), seed=0)
    fleet = Fleet(FleetConfig(work_dir=root, model_dir=model, engines=1, worker_concurrency=8, context_tokens=1024))
    fleet.start()
    return fleet


def fleet_root() -> Path:
    """A work directory the sandbox user can traverse (pytest's and mkdtemp's default are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="rollout-trl-"))
    root.chmod(0o755)
    return root


def train(fleet: Any, recipe: Recipe, out: Path, job: str = "trl") -> RecipeRun:
    """Run the recipe against a started fleet; ``out`` takes TRL's output and the weight exports."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rollout_client.trl import WeightSyncCallback, platform_reward, rollout_func
    from services.rollout_api.dump import stream_entries
    from services.runtime.sync_redis import open_sync_redis

    token = fleet.create_job(job)
    rollout = rollout_func(fleet.url("api"), token, job, recipe.make_task, agent=AGENT, limits=LIMITS,
                           max_attempts=recipe.max_attempts, reruns=recipe.reruns)  # fmt: skip
    sync = WeightSyncCallback(fleet.url("proxy"), token, "default", out / "exports")
    run = RecipeRun()

    class Recording(GRPOTrainer):
        """Keeps what TRL computed from each rollout: the tensors its loss is built from."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            batch = super()._generate_and_score_completions(inputs)
            run.batches.append({**batch, "samples": list(rollout.last)})
            return batch

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.start = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            run.step_s.append(time.perf_counter() - self.start)  # generation, loss, optimizer step, weight sync

    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=len(recipe.prompts) * recipe.num_generations,
        num_generations=recipe.num_generations, max_steps=recipe.steps, learning_rate=5e-3, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
        activation_checkpointing=False,
    )  # fmt: skip
    trainer = Recording(model=str(fleet.config.model_dir), reward_funcs=platform_reward, args=args,
                        train_dataset=Dataset.from_dict({"prompt": list(recipe.prompts)}),
                        processing_class=AutoTokenizer.from_pretrained(fleet.config.model_dir), rollout_func=rollout,
                        callbacks=[sync, StepClock()])  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    run.train_s = time.perf_counter() - start
    run.wait_s, run.global_step = rollout.wait_s, trainer.state.global_step
    run.versions_posted = [version for version, _ in sync.outcomes]
    run.posts_ok = all(outcome.ok for _, outcome in sync.outcomes)
    with open_sync_redis(fleet.redis_url) as client:
        run.published = {t.trajectory_id: t for _, t in stream_entries(client, job)}
    return run


def tokens_match(batch: dict[str, Any], row: int, traj: Any) -> bool:
    """TRL trained on the trajectory's response ids, with its loss mask as the env mask."""
    n = len(traj.response_ids)
    return bool(
        batch["completion_ids"][row][:n].tolist() == traj.response_ids.tolist()
        and int(batch["completion_mask"][row].sum()) == n
        and batch["tool_mask"][row][:n].tolist() == traj.loss_mask.tolist()
    )


def figures(run: RecipeRun) -> dict[str, Any]:
    """``rollout bench trainers``'s keys."""
    checked = matched = 0
    served: set[str] = set()
    for batch in run.batches:
        for row, sample in enumerate(batch["samples"]):
            traj = sample.trajectory
            if traj is not None and traj.status.trainable and len(traj.response_ids):
                checked += 1
                matched += tokens_match(batch, row, traj)
                served.update(traj.weight_versions)
    return {
        "trl_steps": run.global_step,
        "trl_tokens_match": matched / checked if checked else None,
        "trl_weight_versions_served": len(served),
        "served_versions": sorted(served),
        "versions_posted": run.versions_posted,
        "step_s_p50": statistics.median(run.step_s) if run.step_s else None,
        "wait_rollouts_share": run.wait_s / sum(run.step_s) if run.step_s else None,
        "samples_checked": checked,
    }


def run_recipe(recipe: Recipe, work_dir: Path | None = None) -> tuple[RecipeRun, dict[str, Any]]:
    """Start a fleet, run the recipe, stop the fleet; the record and its figures."""
    root = fleet_root()
    fleet = start_fleet(root)
    try:
        run = train(fleet, recipe, work_dir or root)
    finally:
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)
    return run, figures(run)

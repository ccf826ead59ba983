"""TRL 1.16's real ``GRPOTrainer`` trains a tiny byte-level Llama on CPU through a real fleet (API,
worker, proxy, a torch engine, the broker with local sandboxes; ``services.benchmarks.trl_recipe``):
every step's completions are the platform's trajectories token for token, the env mask is their loss
mask, each step's rollout is served by the weights the previous step posted, and an infra-failed
sample never reaches the loss."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.benchmarks.trl_recipe import Recipe, figures, fleet_root, random_reward_task, start_fleet, train
from services.protocol.status import Status
from services.protocol.tasks import RewardSpec, Task
from services.protocol.weights import version_label
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow, pytest.mark.trainer, needs_bwrap, pytest.mark.timeout(600),
    # TRL 1.16 still calls transformers' pre-rename names (gradient -> activation checkpointing)
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning"),
]  # fmt: skip

STEPS = 3
BROKEN = "this task's reward program does not exist"


def make_task(prompt: str) -> Task:
    """The broken prompt's reward program is missing, which the platform reports as an infra error
    (a generous timeout: a reward command that times out scores 0 instead, which a loaded host can cause)."""
    if prompt == BROKEN:
        return Task(id="t", prompt=prompt, reward=RewardSpec(command="python3.99 -c 1", timeout_s=120))
    return random_reward_task(prompt)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Any]:
    root = fleet_root()
    fleet = start_fleet(root)
    try:
        yield fleet
    finally:
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_grpo_trainer_trains_through_the_fleet(fleet: Any, tmp_path: Path) -> None:
    recipe = Recipe(steps=STEPS, prompts=("Write the number 7 to answer.txt", BROKEN), make_task=make_task)
    run = train(fleet, recipe, tmp_path)

    assert run.global_step == STEPS and len(run.batches) == STEPS
    assert run.versions_posted == [version_label(s, 1) for s in range(1, STEPS + 1)] and run.posts_ok
    for step, batch in enumerate(run.batches):
        check_batch(batch, run.published, version_label(step, 1))
    found = figures(run)
    assert found["trl_steps"] == STEPS and found["trl_tokens_match"] == 1.0
    assert found["served_versions"] == sorted(version_label(s, 1) for s in range(STEPS))
    assert 0 < found["wait_rollouts_share"] < 1 and found["samples_checked"] == 4 * STEPS


def check_batch(batch: dict[str, Any], published: dict[str, Any], served_by: str) -> None:
    samples = batch["samples"]
    assert len(samples) == 8
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    for row, sample in enumerate(samples):
        traj = sample.trajectory
        assert traj is not None and published[traj.trajectory_id].response_ids == traj.response_ids
        if traj.status is Status.INFRA_ERROR:  # rerun once, still failed: a masked placeholder
            assert sample.task.prompt == BROKEN and sample.reruns == 1
            assert int(loss_mask[row].sum()) == 0 and float(batch["advantages"][row]) == 0.0
            continue
        assert traj.status.trainable and sample.task.prompt != BROKEN
        n = len(traj.response_ids)
        assert batch["completion_ids"][row][:n].tolist() == traj.response_ids.tolist()  # token for token
        assert int(batch["completion_mask"][row].sum()) == n
        assert batch["tool_mask"][row][:n].tolist() == traj.loss_mask.tolist()  # env_mask = loss mask
        assert (0 in traj.loss_mask.tolist()) == (len(traj.turns) > 1)  # an observation between turns is masked
        assert set(traj.weight_versions) == {served_by}  # the previous step's weights served it
    broken = [s for s in samples if s.task.prompt == BROKEN]
    assert len(broken) == 4 and all(s.trajectory.status is Status.INFRA_ERROR for s in broken)


def test_runs_make_one_group_per_repeated_prompt() -> None:
    from rollout_client.trl import prompt_text, runs

    assert runs(["a", "a", "b", "b", "b", "a"]) == [(0, 2), (2, 3), (5, 1)]
    assert prompt_text([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]) == "hi"
    blocks = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert prompt_text(blocks) == "ab"

"""TRL 1.16's real ``GRPOTrainer`` trains a tiny byte-level Llama on CPU through a real fleet (API,
worker, proxy, a torch engine, the broker with local sandboxes): every step's completions are the
platform's trajectories token for token, the env mask is their loss mask, each step's rollout is
served by the weights the previous step posted, and an infra-failed sample never reaches the loss."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_client.trl import WeightSyncCallback, platform_reward, rollout_func
from services.protocol.agents import BashAgent
from services.protocol.status import Status
from services.protocol.tasks import AgentLimits, RewardSpec, Task
from services.protocol.weights import version_label
from tests.rollout_api.fleet import trajectories
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow, pytest.mark.trainer, needs_bwrap, pytest.mark.timeout(600),
    # TRL 1.16 still calls transformers' pre-rename names (gradient -> activation checkpointing)
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning"),
]  # fmt: skip

JOB = "trl"
STEPS = 3
BROKEN = "this task's reward program does not exist"
AGENT = BashAgent(system_template="Reply with one bash block.", instance_template="{{task}}")


def make_task(prompt: str) -> Task:
    """A reward that varies between samples (a random byte: the plumbing, not learning, is tested here);
    the broken prompt's reward program is missing, which the platform reports as an infra error."""
    command = "python3.99 -c 1" if prompt == BROKEN else "od -An -N1 -tu1 /dev/urandom"
    return Task(id="t", prompt=prompt, reward=RewardSpec(command=command, parse_float=True, timeout_s=10))


@pytest.fixture(scope="module")
def fleet() -> Iterator[Any]:
    from services.fleet.demo import ModelShape, initial_model
    from services.fleet.launcher import Fleet, FleetConfig

    root = Path(tempfile.mkdtemp(prefix="rollout-trl-"))
    root.chmod(0o755)  # the sandbox user must reach the sandboxes' directories (pytest's tmp root is 0700)
    model = initial_model(root / "model", ModelShape(hidden=32, layers=2, heads=4, kv_heads=2), seed=0)
    fleet = Fleet(FleetConfig(work_dir=root, model_dir=model, engines=1, worker_concurrency=8, context_tokens=1024))
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_grpo_trainer_trains_through_the_fleet(fleet: Any, tmp_path: Path) -> None:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    model_dir = fleet.config.model_dir
    token = fleet.create_job(JOB)
    rollout = rollout_func(fleet.url("api"), token, JOB, make_task, agent=AGENT, max_attempts=1, reruns=1,
                           limits=AgentLimits(max_turns=2, max_tokens_per_turn=12, command_timeout_s=5))  # fmt: skip
    sync = WeightSyncCallback(fleet.url("proxy"), token, "default", tmp_path / "exports")
    seen: list[dict[str, Any]] = []

    class Recording(GRPOTrainer):
        """Keeps what TRL computed from each rollout: the tensors its loss is built from."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            seen.append({**out, "samples": list(rollout.last)})
            return out

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, num_generations=4, max_steps=STEPS,
        learning_rate=5e-3, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, seed=0,
        dataloader_num_workers=0, activation_checkpointing=False,
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": ["Write the number 7 to answer.txt", BROKEN]})
    trainer = Recording(model=str(model_dir), reward_funcs=platform_reward, args=args, train_dataset=dataset,
                        processing_class=AutoTokenizer.from_pretrained(model_dir), rollout_func=rollout,
                        callbacks=[sync])  # fmt: skip
    trainer.train()

    assert trainer.state.global_step == STEPS and len(seen) == STEPS
    assert [v for v, o in sync.outcomes] == [version_label(s, 1) for s in range(1, STEPS + 1)]
    assert all(o.ok for _, o in sync.outcomes)
    published = {t.trajectory_id: t for t in trajectories(fleet.redis_url, JOB)}  # the stream itself
    for step, batch in enumerate(seen):
        check_batch(batch, published, version_label(step, 1))


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

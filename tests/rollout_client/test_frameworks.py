"""The slime/miles generate function and the verl agent loop fill every field their framework reads,
typed as it expects, from the platform's token-exact record; an infra failure never reaches the loss."""

from __future__ import annotations

import inspect

import msgspec

from rollout_client.slime import fill_sample, generate
from rollout_client.verl import to_output
from services.protocol.status import Cap, Status
from services.protocol.trajectory import Trajectory
from tests.rollout_client.framework_types import SlimeSample, VerlAgentLoopMetrics, VerlAgentLoopOutput
from tests.trainer.factories import make_trajectory


def check_slime(sample: SlimeSample, traj: Trajectory) -> None:
    n = sample.response_length
    assert isinstance(n, int) and n == len(traj.response_ids) > 0
    assert all(isinstance(t, int) for t in sample.tokens) and sample.tokens[-n:] == traj.response_ids.tolist()
    assert sample.tokens[:-n] == traj.prompt_ids.tolist()
    assert sample.rollout_log_probs is not None and len(sample.rollout_log_probs) == n
    assert all(isinstance(x, float) for x in sample.rollout_log_probs)
    assert sample.loss_mask is not None and len(sample.loss_mask) == n
    assert isinstance(sample.reward, float) and isinstance(sample.status, SlimeSample.Status)
    assert sample.weight_versions == traj.weight_versions and all(isinstance(v, str) for v in sample.weight_versions)


def test_slime_sample_of_a_completed_episode() -> None:
    traj = make_trajectory("g", 0, turns=3, reward=1.0, seed=1)
    sample = fill_sample(SlimeSample(prompt="p", metadata={"task": {}}), traj)
    check_slime(sample, traj)
    assert sample.loss_mask == traj.loss_mask.tolist() and 0 in sample.loss_mask  # observations masked
    assert sample.status is SlimeSample.Status.COMPLETED and sample.reward == 1.0 and not sample.remove_sample
    assert "evaluation" in inspect.signature(generate).parameters  # slime passes evaluation= when it is there


def test_slime_truncated_and_infra_failed() -> None:
    cut = msgspec.structs.replace(make_trajectory("g", 1, reward=0.0, seed=2), status=Status.TRUNCATED,
                                  truncation=Cap.TURNS)  # fmt: skip
    assert fill_sample(SlimeSample(), cut).status is SlimeSample.Status.TRUNCATED
    failed = make_trajectory("g", 2, status=Status.INFRA_ERROR, seed=3)
    sample = fill_sample(SlimeSample(), failed)
    check_slime(sample, failed)
    assert sample.remove_sample and sample.status is SlimeSample.Status.FAILED
    assert sample.loss_mask == [0] * sample.response_length  # nothing of it reaches the loss
    assert sample.metadata["infra"]["stage"] == "sandbox_exec"


def test_verl_output_of_episodes() -> None:
    traj = make_trajectory("g", 0, turns=2, reward=0.5, seed=4)
    out = to_output(traj, VerlAgentLoopOutput, VerlAgentLoopMetrics)
    checked = VerlAgentLoopOutput.model_validate(out.model_dump())  # every field verl reads, its types
    assert checked.prompt_ids == traj.prompt_ids.tolist() and checked.response_ids == traj.response_ids.tolist()
    assert checked.response_mask == traj.loss_mask.tolist()
    assert checked.response_logprobs is not None and len(checked.response_logprobs) == len(checked.response_ids)
    assert checked.reward_score == 0.5 and checked.num_turns == 6 and not checked.extra_fields["remove_sample"]
    failed = to_output(make_trajectory("g", 1, status=Status.INFRA_ERROR, seed=5), VerlAgentLoopOutput,
                       VerlAgentLoopMetrics)  # fmt: skip
    assert set(failed.response_mask) == {0} and failed.reward_score is None and failed.extra_fields["remove_sample"]

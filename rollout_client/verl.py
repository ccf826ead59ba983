"""verl: an agent loop, registered as ``rollout_platform``, that runs each sample as a platform episode.

verl (volcengine/verl, read at commit 6c923f3b724ad8a3647e9fc818e485c078703d07,
``verl/experimental/agent_loop/agent_loop.py``) instantiates a registered ``AgentLoopBase`` per
sample and awaits ``run(sampling_params, **dataset_fields)``, which returns an ``AgentLoopOutput``:
``prompt_ids``, ``response_ids`` (generated and tool tokens), ``response_mask`` (1 generated, 0 tool),
``response_logprobs``, ``reward_score``, ``num_turns``, ``metrics`` (``AgentLoopMetrics``:
``generate_sequences``, ``tool_calls`` seconds) and ``extra_fields``. Select it per sample with the
dataset's ``agent_name`` column set to ``rollout_platform``, and import this module in verl's workers
(e.g. through ``agent_loop_config_path``). The task is the sample's ``extra_info["task"]`` or
``metadata["task"]`` (:mod:`rollout_client.episodes`).

Without verl installed this module still imports (the adapter's logic is tested against verl's
types rebuilt from that commit); the loop class is then a plain class that is registered nowhere.
An infra failure never reaches the loss: ``response_mask`` all 0, ``reward_score`` None and
``extra_fields["remove_sample"]`` True.
"""

from __future__ import annotations

import importlib
from typing import Any

from rollout_client.episodes import runner, sampling_of, task_of
from services.protocol.trajectory import Trajectory

AGENT_NAME = "rollout_platform"

try:
    _verl: Any = importlib.import_module("verl.experimental.agent_loop.agent_loop")
except ImportError:  # verl is not installed here
    _verl = None


def to_output(traj: Trajectory, output_cls: Any, metrics_cls: Any) -> Any:
    """verl's ``AgentLoopOutput`` (``output_cls``, with ``metrics_cls``) of one trajectory."""
    if traj.segments:
        raise ValueError(f"{traj.trajectory_id} has {1 + len(traj.segments)} segments: not one verl sample")
    usable = traj.status.trainable and traj.reward is not None
    response = traj.response_ids.tolist()
    return output_cls(
        prompt_ids=traj.prompt_ids.tolist(),
        response_ids=response,
        response_mask=traj.loss_mask.tolist() if usable else [0] * len(response),
        response_logprobs=[float(x) for x in traj.response_logprobs],
        reward_score=float(traj.reward) if usable and traj.reward is not None else None,
        num_turns=2 + 2 * len(traj.turns),  # system and user, then each turn's reply and its observation
        metrics=metrics_cls(generate_sequences=traj.timings.llm_s, tool_calls=traj.timings.exec_s),
        extra_fields={
            "trajectory_id": traj.trajectory_id,
            "status": traj.status.value,
            "weight_versions": traj.weight_versions,
            "remove_sample": not usable,
        },  # fmt: skip
    )


class PlatformAgentLoop(_verl.AgentLoopBase if _verl else object):  # type: ignore[misc]
    """``AgentLoopBase.run``: one platform episode for the sample."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        meta = kwargs.get("extra_info") or kwargs.get("metadata") or {}
        traj = await runner().run(task_of(kwargs.get("raw_prompt") or "", meta), sampling_of(sampling_params))
        return to_output(traj, _verl.AgentLoopOutput, _verl.AgentLoopMetrics)


if _verl is not None:
    _verl.register(AGENT_NAME)(PlatformAgentLoop)

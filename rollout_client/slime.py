"""slime / miles: a custom generate function that runs each sample as a platform episode.

``--custom-generate-function-path rollout_client.slime.generate``. slime (THUDM/slime, read at
commit 3c9aa092ef7f302f720aecc69fdbcfe6e7743974, ``slime/rollout/sglang_rollout.py``) awaits
``generate(args, sample, sampling_params)`` (with ``evaluation=`` when the signature has it) for each
sample of a group and reads back the fields its own ``generate`` fills (``slime/utils/types.py``,
``Sample`` at commit 7985bf23a5a043f51bc1411ef2bb115ee6a2e174; miles keeps the same ``Sample``):

- ``tokens``: prompt and response ids; ``response_length``: how many of them are the response;
- ``response``: the response text; ``loss_mask`` and ``rollout_log_probs``: one per response token
  (0 and 0.0 on observation tokens);
- ``reward`` (set here, so slime's reward model is not called), ``status``, ``weight_versions`` (one
  per turn), ``metadata``; ``remove_sample`` for an infra failure, which never reaches the loss:
  its loss mask is all 0 and slime drops it (status ``FAILED``, reward 0.0 only as a placeholder).

The task comes from the sample's ``metadata["task"]`` (:mod:`rollout_client.episodes`).
"""

from __future__ import annotations

from typing import Any

from rollout_client.episodes import runner, sampling_of, task_of
from services.protocol.status import Status
from services.protocol.trajectory import Trajectory


def fill_sample(sample: Any, traj: Trajectory, text: str = "") -> Any:
    """Write ``traj`` into a slime ``Sample`` (any object with its fields and its ``Status`` enum)."""
    if traj.segments:
        raise ValueError(f"{traj.trajectory_id} has {1 + len(traj.segments)} segments: not one slime sample")
    statuses = type(sample).Status
    response = traj.response_ids.tolist()
    sample.tokens = traj.prompt_ids.tolist() + response
    sample.response_length = len(response)
    sample.response = text or "".join(m.content for m in (traj.messages or [])[2:] if m.role == "assistant")
    sample.rollout_log_probs = [float(x) for x in traj.response_logprobs]
    sample.weight_versions = traj.weight_versions
    sample.metadata = {**(sample.metadata or {}), "trajectory_id": traj.trajectory_id, "status": traj.status.value}
    if traj.status.trainable and traj.reward is not None:
        sample.loss_mask = traj.loss_mask.tolist()
        sample.reward = float(traj.reward)
        sample.status = statuses.TRUNCATED if traj.status is Status.TRUNCATED else statuses.COMPLETED
        sample.remove_sample = False
    else:  # infra_error (after the platform's retries) or cancelled: kept out of the loss
        sample.loss_mask = [0] * len(response)
        sample.reward = 0.0
        sample.status = statuses.FAILED
        sample.remove_sample = True
        if traj.infra is not None:
            sample.metadata["infra"] = {"stage": traj.infra.stage.value, "code": traj.infra.code}
    return sample


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate function: one platform episode for ``sample``."""
    traj = await runner().run(task_of(sample.prompt, sample.metadata), sampling_of(sampling_params))
    return fill_sample(sample, traj)

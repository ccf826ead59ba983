"""Trajectories for trainer tests, built through the contract (never hand-written dicts)."""

from __future__ import annotations

import random

from services.protocol.status import InfraStage, Status
from services.protocol.trajectory import InfraFailure, Trajectory, Turn, logprobs, mask, token_ids


def make_trajectory(
    group: str = "g0",
    sample: int = 0,
    *,
    reward: float = 1.0,
    status: Status = Status.COMPLETED,
    version: str = "0",
    group_size: int = 4,
    attempt: int = 1,
    prompt_len: int = 6,
    turns: int = 2,
    gen_len: int = 4,
    obs_len: int = 3,
    vocab: int = 259,
    seed: int | None = None,
    job: str = "job1",
) -> Trajectory:
    """A multi-turn trajectory: per turn ``gen_len`` generated tokens then ``obs_len`` tool tokens."""
    rng = random.Random(seed if seed is not None else hash((group, sample, attempt)))
    ids: list[int] = []
    lmask: list[int] = []
    lps: list[float] = []
    turn_list: list[Turn] = []
    for t in range(turns):
        turn_list.append(
            Turn(index=t, response_offset=len(ids), response_tokens=gen_len, prompt_tokens=prompt_len + len(ids),
                 weight_version=version, engine_id="e0", finish_reason="stop", llm_s=0.01)
        )  # fmt: skip
        ids += [rng.randrange(vocab) for _ in range(gen_len)]
        lmask += [1] * gen_len
        lps += [-rng.uniform(0.5, 6.0) for _ in range(gen_len)]
        if t < turns - 1:
            ids += [rng.randrange(256) for _ in range(obs_len)]
            lmask += [0] * obs_len
            lps += [0.0] * obs_len
    infra = None
    if status is Status.INFRA_ERROR:
        infra = InfraFailure(stage=InfraStage.SANDBOX_EXEC, code="sandbox_died", message="gone")
    traj = Trajectory(
        trajectory_id=f"r1:{group}:{sample}", attempt=attempt, job=job, rollout_id="r1", task_id=group,
        group_id=group, sample_index=sample, group_size=group_size, status=status, infra=infra,
        reward=reward if status.trainable else None,
        prompt_ids=token_ids(rng.randrange(256) for _ in range(prompt_len)), response_ids=token_ids(ids),
        loss_mask=mask(lmask), response_logprobs=logprobs(lps), turns=turn_list,
    )  # fmt: skip
    traj.check()
    return traj

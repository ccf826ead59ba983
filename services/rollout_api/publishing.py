"""Publishing a trajectory's single final record (worker, or the API when it drops queued work)."""

from __future__ import annotations

import time

from services.protocol import Cap, Status, Trajectory, WorkItem, to_stream_fields
from services.protocol.api import SampleResult
from services.rollout_api.redis_scripts import Outcome, Scripts


def trajectory_shell(item: WorkItem, attempt: int, status: Status, *, worker: str = "") -> Trajectory:
    """A trajectory for ``item`` with identity filled in and no token data yet."""
    now = time.time()
    return Trajectory(
        trajectory_id=item.trajectory_id,
        attempt=attempt,
        job=item.job,
        rollout_id=item.rollout_id,
        task_id=item.task.id,
        group_id=item.group_id,
        sample_index=item.sample_index,
        group_size=item.group_size,
        mode=item.mode,
        status=status,
        metadata=dict(item.task.metadata),
        source=item.task.source,
        source_version=item.task.source_version,
        worker=worker,
        started_at=now,
        finished_at=now,
    )


async def publish(scripts: Scripts, traj: Trajectory, *, maxlen: int, ran: bool) -> str | None:
    """XADD ``traj`` to its job's stream unless the trajectory already has a final record."""
    traj.check()
    outcome = Outcome(
        trajectory_id=traj.trajectory_id,
        attempt=traj.attempt,
        status=traj.status.value,
        duration_s=max(0.0, traj.finished_at - traj.started_at),
        turn_cap=traj.truncation is Cap.TURNS,
        turns=len(traj.turns),
        ran=ran,
        infra_stage=traj.infra.stage.value if traj.infra else None,
        mode=traj.mode,
        result=_result(traj) if traj.mode == "eval" else "",
    )
    return await scripts.publish(
        traj.job, traj.rollout_id, outcome, to_stream_fields(traj), maxlen=maxlen, now=traj.finished_at
    )


def _result(traj: Trajectory) -> str:
    """What pass@k needs of an evaluation sample (``GET /rollouts/{id}/eval``)."""
    return SampleResult(
        task_id=traj.task_id, sample_index=traj.sample_index, status=traj.status.value, reward=traj.reward,
        weight_versions=traj.weight_versions,
    ).model_dump_json()  # fmt: skip

"""Kill the trainer (a real subprocess) with SIGKILL mid-run, restart it: every trajectory is used exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from services.protocol import keys
from services.protocol.status import Status
from services.protocol.trajectory import Trajectory, to_stream_fields
from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.conftest import TINY
from tests.trainer.factories import make_trajectory
from trainer_client.checkpoint import TrainerState, latest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

GROUP_SIZE = 4


def group(name: str) -> list[Trajectory]:
    trajs = [make_trajectory(name, i, reward=float(i % 2), group_size=GROUP_SIZE) for i in range(GROUP_SIZE)]
    if name == "g1":  # one infra failure: removed, never trained on
        trajs[3] = make_trajectory(name, 3, status=Status.INFRA_ERROR, group_size=GROUP_SIZE)
    return trajs


def publish(client: redis.Redis, trajs: list[Trajectory]) -> None:
    for traj in trajs:
        client.xadd(keys.trajectory_stream("job1"), to_stream_fields(traj))  # type: ignore[arg-type]


def saved_state(run: Path) -> TrainerState:
    path = latest(run / "checkpoints")
    assert path is not None
    return TrainerState.model_validate_json((path / "trainer_state.json").read_text())


def start_trainer(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "trainer_client.main"], env=env, cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def wait_for_steps(log: Path, proc: subprocess.Popen[bytes], n: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, f"trainer exited early:\n{output(log)}"
        time.sleep(0.05)
    raise TimeoutError(f"trainer did not reach step {n}")


def output(steps_log: Path) -> str:
    """The trainer's own output (written beside the run directory)."""
    return (steps_log.parent.parent / "trainer.log").read_text()[-3000:]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.timeout(600)
def test_kill_mid_run_and_resume_uses_every_trajectory_once(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, tokenizer_dir: Path
) -> None:
    env = python_env({
        "ROLLOUT_TRAIN_JOB": "job1", "ROLLOUT_TRAIN_REDIS_URL": redis_url,
        "ROLLOUT_TRAIN_WORK_DIR": str(tmp_path / "run"),
        "ROLLOUT_TRAIN_TOKENIZER_DIR": str(tokenizer_dir), "ROLLOUT_TRAIN_BATCH_GROUPS": "1",
        "ROLLOUT_TRAIN_GROUP_SIZE": str(GROUP_SIZE), "ROLLOUT_TRAIN_MAX_STALENESS": "100",
        "ROLLOUT_TRAIN_MAX_STEPS": "5", "ROLLOUT_TRAIN_CHECKPOINT_EVERY": "2", "ROLLOUT_TRAIN_PLOT": "false",
        "ROLLOUT_TRAIN_MODEL": json.dumps(TINY), "ROLLOUT_TRAIN_WAIT_TIMEOUT_S": "60",
    })  # fmt: skip
    steps_log, out_log = tmp_path / "run" / "steps.jsonl", tmp_path / "trainer.log"
    all_groups = [group(f"g{i}") for i in range(5)]
    # first run sees 3 full groups and half of the 4th, plus a duplicate of an entry
    publish(redis_client, [t for g in all_groups[:3] for t in g] + all_groups[3][:2] + [all_groups[0][0]])
    proc = start_trainer(env, out_log)
    try:
        wait_for_steps(steps_log, proc, 3)  # steps 1, 2 checkpointed; step 3 trained, not checkpointed
        stop(proc)  # SIGKILL: step 3 and the half group are still unacknowledged
        assert saved_state(tmp_path / "run").step == 2
        publish(redis_client, all_groups[3][2:] + all_groups[4])
        proc = start_trainer(env, out_log)
        assert proc.wait(timeout=240) == 0, out_log.read_text()[-3000:]
    finally:
        stop(proc)

    final = saved_state(tmp_path / "run")
    trainable = [f"{t.trajectory_id}#{t.attempt}" for g in all_groups for t in g if t.status.trainable]
    assert final.step == 5
    assert Counter(final.used) == Counter(trainable)  # each exactly once, none lost
    assert final.drops == {"infra_error": 1, "duplicate": 1}
    group_name = keys.TRAINERS_GROUP
    assert redis_client.xpending(keys.trajectory_stream("job1"), group_name)["pending"] == 0
    steps = [json.loads(line)["version"] for line in steps_log.read_text().splitlines()]
    # step 3 was redone after the restart, from checkpoint 2, by a new run epoch: a new label
    assert steps == ["1-e1", "2-e1", "3-e1", "3-e2", "4-e2", "5-e2"]
    assert (tmp_path / "run" / "exports" / "v5-e2" / "model.safetensors").exists()

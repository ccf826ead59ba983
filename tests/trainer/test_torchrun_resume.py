"""``rollout-train`` under ``torchrun --nproc-per-node 2`` (data parallel over gloo), killed as an outsider
would: rank 1 gets SIGKILL right after rank 0 posted new weights and before the checkpoint that keeps
them, while the engines already generate with those weights. The restart (same world size) takes a
new run epoch: no label ever names two sets of weights, the trajectories of the lost weights are
dropped as ``orphaned`` (counted), and every other trajectory is decided exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest
import redis

from services.protocol import keys
from services.protocol.api import JobCreate
from services.protocol.tasks import RewardSpec, Task
from services.protocol.trajectory import from_stream_fields, to_stream_fields
from services.protocol.weights import WeightUpdate
from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.conftest import TINY
from tests.trainer.factories import make_trajectory
from tests.trainer.fake_fleet import FleetState, serve_fleet
from tests.trainer.launch import torchrun_argv
from trainer_client.checkpoint import TrainerState, latest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

LOST = "3-e1"  # the weights posted and then lost with the crash


def torchrun(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        argv = torchrun_argv(2, "trainer_client.main")
        return subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def kill_rank_1_when_lost_weights_posted(state: FleetState, client: redis.Redis, launcher: list[int]) -> None:
    """On the post of LOST: engines serve it and one group is generated with it; then rank 1 is killed."""

    def hook(update: WeightUpdate) -> None:
        if update.version != LOST:
            return
        for i in range(4):
            traj = make_trajectory("lost", i, reward=float(i % 2), version=LOST, job="job1", seed=i)
            client.xadd(keys.trajectory_stream("job1"), to_stream_fields(traj))  # type: ignore[arg-type]
        workers = psutil.Process(launcher[0]).children(recursive=True)
        [rank1] = [p for p in workers if p.environ().get("RANK") == "1" and "trainer_client.main" in p.cmdline()]
        rank1.send_signal(signal.SIGKILL)

    state.on_weights = hook


@pytest.mark.timeout(600)
def test_kill_a_rank_between_weight_post_and_checkpoint(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, tokenizer_dir: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(Task(id=f"t{i}", prompt="p", reward=RewardSpec(command="true")).model_dump_json() + "\n"
                             for i in range(4)))  # fmt: skip
    run, log = tmp_path / "run", tmp_path / "trainer.log"
    launcher: list[int] = []
    with serve_fleet(redis_url, prompt_len=5, turns=1, gen_len=3) as (url, fleet):
        fleet.jobs["job1"] = JobCreate(job="job1")  # the trainer reads the job's pool from the API
        env = python_env({
            "ROLLOUT_TRAIN_JOB": "job1", "ROLLOUT_TRAIN_REDIS_URL": redis_url, "ROLLOUT_TRAIN_API_URL": url,
            "ROLLOUT_TRAIN_PROXY_URL": url, "ROLLOUT_TRAIN_TASKS_PATH": str(tasks), "ROLLOUT_TRAIN_WORK_DIR": str(run),
            "ROLLOUT_TRAIN_TOKENIZER_DIR": str(tokenizer_dir), "ROLLOUT_TRAIN_GROUP_SIZE": "4",
            "ROLLOUT_TRAIN_BATCH_GROUPS": "1", "ROLLOUT_TRAIN_MAX_STALENESS": "3", "ROLLOUT_TRAIN_MAX_STEPS": "4",
            "ROLLOUT_TRAIN_CHECKPOINT_EVERY": "2", "ROLLOUT_TRAIN_PLOT": "false", "ROLLOUT_TRAIN_WAIT_TIMEOUT_S": "60",
            "ROLLOUT_TRAIN_MODEL": json.dumps(TINY), "ROLLOUT_TRAIN_OPTIM__WARMUP_STEPS": "2", "OMP_NUM_THREADS": "1",
        })  # fmt: skip
        kill_rank_1_when_lost_weights_posted(fleet, redis_client, launcher)
        proc = torchrun(env, log)
        launcher.append(proc.pid)
        try:
            assert proc.wait(timeout=240) != 0, log.read_text()[-3000:]  # torchrun gives up when a rank dies
            assert TrainerState.model_validate_json(_state_file(run).read_text()).step == 2
            fleet.on_weights = None
            proc = torchrun({**env, "ROLLOUT_TRAIN_MAX_STEPS": "6"}, log)  # long enough to read the lost group
            assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        posted = [u.version for u in fleet.updates]
        checksums: dict[str, set[str]] = defaultdict(set)
        for update in fleet.updates:
            checksums[update.version].add(update.checksum)

    assert posted == ["1-e1", "2-e1", LOST, "2-e1", "3-e2", "4-e2", "5-e2", "6-e2"]  # kept weights go back first
    assert all(len(c) == 1 for c in checksums.values())  # a label names one set of weights, for ever
    final = TrainerState.model_validate_json(_state_file(run).read_text())
    assert (final.step, final.epoch, final.version) == (6, 2, "6-e2")
    entries: list[tuple[bytes, dict[bytes, bytes]]] = redis_client.xrange(keys.trajectory_stream("job1"))  # type: ignore[assignment]
    all_keys = {f"{t.trajectory_id}#{t.attempt}" for t in (from_stream_fields(f) for _, f in entries)}
    assert max(Counter(final.used).values()) == 1  # nothing trained twice
    assert not set(final.used) & set(final.dropped)
    decided = set(final.used) | set(final.dropped)
    info = redis_client.xinfo_groups(keys.trajectory_stream("job1"))[0]
    assert decided <= all_keys and len(all_keys - decided) == info["pending"] + info["lag"]  # the rest still held
    lost = {k for k in all_keys if ":lost:" in k}
    assert len(lost) == 4 and {final.dropped[k] for k in lost} == {"orphaned"}
    assert final.drops["orphaned"] == 4
    records = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records][-4:] == ["3-e2", "4-e2", "5-e2", "6-e2"]
    assert all(len(r["rank_timings"]) == 2 and r["rank_timings"][1]["update_s"] > 0 for r in records)


def _state_file(run: Path) -> Path:
    path = latest(run / "checkpoints")
    assert path is not None
    return path / "trainer_state.json"

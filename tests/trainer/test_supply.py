"""Admission control, over-provisioning with carry-over, and the whole loop against a real stream and HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from services.protocol import keys
from services.protocol.api import JobCreate
from services.protocol.tasks import RewardSpec, Task
from tests.trainer.conftest import TINY
from tests.trainer.fake_fleet import serve_fleet
from trainer_client.main import run
from trainer_client.metrics import StepLog
from trainer_client.settings import TrainSettings
from trainer_client.supply import Admission


def test_admission_cap_is_staleness_plus_one_batches() -> None:
    adm = Admission(batch_groups=4, max_staleness=2, overprovision=10.0)
    assert adm.cap == 12 and adm.target == 12  # over-provisioning never passes the cap
    assert adm.to_request(in_flight=0) == 12 and adm.to_request(in_flight=9) == 3 and adm.to_request(20) == 0


def test_overprovision_target_within_cap() -> None:
    adm = Admission(batch_groups=4, max_staleness=2, overprovision=1.5)
    assert adm.target == 6 and adm.to_request(in_flight=4) == 2
    assert Admission(batch_groups=4, max_staleness=0, overprovision=2.0).target == 4  # no staleness: no extra


@pytest.mark.trainer
@pytest.mark.slow
def test_training_loop_with_api_and_proxy(tmp_path: Path, redis_url: str, tokenizer_dir: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(Task(id=f"t{i}", prompt="p", reward=RewardSpec(command="true")).model_dump_json() + "\n"
                             for i in range(3)))  # fmt: skip
    with serve_fleet(redis_url) as (url, fleet):
        fleet.jobs["job1"] = JobCreate(job="job1")  # the trainer reads the job's pool from the API
        settings = TrainSettings(
            job="job1", redis_url=redis_url, api_url=url, tasks_path=tasks, proxy_url=url, pool="default",
            tokenizer_dir=tokenizer_dir, work_dir=tmp_path / "run", model=TINY, group_size=4, batch_groups=1,
            max_staleness=1, overprovision=2.0, max_steps=4, checkpoint_every=2, micro_batch_tokens=256,
            wait_timeout_s=20,
        )  # fmt: skip
        run(settings.model_copy(update={"max_steps": 3}))
        requested_before_restart = fleet.requested_groups
        run(settings)  # resumes from checkpoint 3: admission state restored, repeated requests deduplicated
    records = StepLog(settings.step_log).read()
    assert [r.step for r in records] == [1, 2, 3, 4]
    # the resumed trainer repeats the requests its checkpoint had not counted yet, and the API answers them
    # without queueing twice: it then asks for at most the two groups its admission allows, plus one for
    # each group it drops meanwhile: a carried group more than max_staleness behind, which depends on
    # when each request came in against the weight updates (a loaded run asked for 3 after the restart)
    dropped_after_restart = sum(sum(r.dropped_groups.values()) for r in records[3:])
    assert fleet.requested_groups <= requested_before_restart + 2 + dropped_after_restart
    # admission: never more than (max_staleness + 1) x batch_groups = 2 groups requested and unfinished
    assert all(r.in_flight_groups <= 2 for r in records)
    trained = sum(r.groups for r in records)
    dropped = sum(sum(r.dropped_groups.values()) for r in records)
    assert fleet.requested_groups <= trained + dropped + 2
    # over-provisioning: two groups requested per batch of one; the spare one is carried, never thrown away
    assert any(r.carried_groups >= 1 for r in records)
    unfinished = fleet.requested_groups - trained - dropped
    info = redis.Redis.from_url(redis_url).xinfo_groups(keys.trajectory_stream("job1"))[0]
    assert info["pending"] + info["lag"] == unfinished * 4  # held (unacknowledged) or not yet read
    # weight notices: every step's export reached the proxy with its checksum and was accepted; the restart
    # (run epoch 2) first puts back the weights of its checkpoint, then labels its own steps with its epoch
    assert [u.version for u in fleet.updates] == ["1-e1", "2-e1", "3-e1", "3-e1", "4-e2"]
    assert all(r.sync_ok for r in records)
    # staleness is measured against the version that generated the tokens (carried groups are 1 behind)
    assert any("1" in r.staleness for r in records) and all(set(r.staleness) <= {"0", "1"} for r in records)
    assert all(r.timings["update_s"] > 0 and r.timings["export_sync_s"] > 0 for r in records)
    assert (settings.work_dir / "steps.png").stat().st_size > 10_000
    assert json.loads((settings.export_dir / "v4-e2" / "config.json").read_text())["eos_token_id"] == 258

"""The Harbor fixture set end to end: ``rollout tasks import harbor`` builds every task's image
offline (one shared base) and registers its template; then a real fleet (API, worker, proxy,
scripted engine, broker with local sandboxes) runs each task with the oracle (solution/solve.sh:
reward 1.0) and with a no-op (0.0). A tampering agent gains nothing, and tests that write no
reward file are an infra error, never a 0."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.cli.main import main
from services.environments import harbor
from services.protocol import InfraStage, RolloutRequest, Status, Task, Trajectory
from tests.environments.harbor_support import busybox_base, task_dirs
from tests.rollout_api.fleet import ADMIN, SUBMIT, Fleet, create_job, running_fleet, trajectories, wait_finished
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap, pytest.mark.timeout(400)]

TAMPER = ("```bash\nmkdir -p /tests /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
          "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh\n```")  # fmt: skip
RULES: dict[str, list[Any]] = {
    **{f"ORACLE-{t.name}\n": [f"```bash\n{harbor.oracle_command(t)}\n```", SUBMIT]
       for t in map(harbor.load, task_dirs())},
    "NOOP-RUN\n": [SUBMIT],
    "TAMPER-RUN\n": [TAMPER, SUBMIT],
}  # fmt: skip


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, list[Task]]]:
    with running_fleet(tmp_path_factory.mktemp("harbor"), RULES, "harbor") as fleet:
        out = fleet.state_dir / "harbor"
        base = busybox_base(fleet.state_dir / "base")
        argv = ["tasks", "import", "harbor", str(task_dirs()[0].parent), "--out", str(out), "--base",
                f"ubuntu:24.04={base}", "--host-usr", "--broker-url", fleet.broker.url, "--state-dir",
                str(fleet.state_dir), "--cache", str(fleet.state_dir / "cache")]  # fmt: skip
        with pytest.MonkeyPatch.context() as env:
            env.setenv("ROLLOUT_ADMIN_TOKEN", ADMIN)
            assert main(argv) == 0
        tasks = RolloutRequest.model_validate_json((out / "rollout.json").read_text()).tasks
        fleet.start_worker(concurrency=8)
        yield fleet, tasks


def _run(fleet: Fleet, job: str, tasks: list[Task], max_attempts: int = 3) -> dict[str, Trajectory]:
    body = {"job": job, "group_size": 1, "max_attempts": max_attempts,
            "tasks": [t.model_dump(mode="json") for t in tasks]}  # fmt: skip
    with fleet.client() as client:
        headers = create_job(client, job)
        response = client.post("/rollouts", json=body, headers=headers)
        assert response.status_code == 202, response.text
        wait_finished(client, headers, response.json()["rollout_id"], timeout_s=240)
    return {t.task_id: t for t in trajectories(fleet.redis_url, job)}


def _prefixed(tasks: list[Task], prefix: str) -> list[Task]:
    return [t.model_copy(update={"prompt": prefix.format(name=t.id) + t.prompt}) for t in tasks]


def test_the_import_registers_one_template_per_task(imported: tuple[Fleet, list[Task]]) -> None:
    fleet, tasks = imported
    assert len(tasks) == len(task_dirs()) >= 10
    listed = httpx.get(f"{fleet.broker.url}/templates", headers={"Authorization": f"Bearer {ADMIN}"})
    assert listed.status_code == 200, listed.text
    assert {t.sandbox.template for t in tasks} <= {t["name"] for t in listed.json()}
    templates = json.loads((fleet.state_dir / "harbor" / "templates.json").read_text())
    assert all(Path(t["image"]).is_dir() for t in templates)  # OCI layouts


def test_the_oracle_scores_1_and_a_noop_0_on_every_task(imported: tuple[Fleet, list[Task]]) -> None:
    fleet, tasks = imported
    oracle = _run(fleet, "harbor-oracle", _prefixed(tasks, "ORACLE-{name}\n"))
    noop = _run(fleet, "harbor-noop", _prefixed(tasks, "NOOP-RUN\n"))
    assert {k: (t.status, t.reward) for k, t in oracle.items()} == {t.id: (Status.COMPLETED, 1.0) for t in tasks}, {
        k: t.reward_details or t.infra for k, t in oracle.items() if t.reward != 1.0}  # fmt: skip
    assert {k: (t.status, t.reward) for k, t in noop.items()} == {t.id: (Status.COMPLETED, 0.0) for t in tasks}
    assert all((t.source, t.source_version[:7]) == ("harbor", "sha256:") for t in [*oracle.values(), *noop.values()])


def test_tampering_gains_nothing_and_a_missing_reward_file_is_an_infra_error(
    imported: tuple[Fleet, list[Task]],
) -> None:
    fleet, tasks = imported
    hello = next(t for t in tasks if t.id == "hello-world")
    [tampered] = _run(fleet, "harbor-tamper", _prefixed([hello], "TAMPER-RUN\n")).values()
    assert (tampered.status, tampered.reward) == (Status.COMPLETED, 0.0)  # its /tests and reward.txt were replaced
    silent = hello.reward.model_copy(update={"files": {f"{harbor.STAGE}/test.sh": "echo 'wrote no reward'\n"}})
    broken = hello.model_copy(update={"id": "no-reward-file", "prompt": "NOOP-RUN\n" + hello.prompt, "reward": silent})
    [traj] = _run(fleet, "harbor-infra", [broken], max_attempts=1).values()
    assert traj.status is Status.INFRA_ERROR and traj.reward is None
    assert traj.infra is not None and traj.infra.stage is InfraStage.REWARD
    assert "no /logs/verifier/reward.txt" in traj.infra.message

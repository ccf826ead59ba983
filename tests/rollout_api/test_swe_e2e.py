"""Task images and SWE-style scoring end to end (real API, workers, broker with local sandboxes):
the reward runs in the task's workdir with its env, per-test outcomes decide it, the agent's edits
to the tests never count, and a reward that cannot run is an infra error, not reward 0."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.protocol import InfraStage, Status
from tests.rollout_api.fleet import (
    ADMIN,
    SUBMIT,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    trajectories,
    wait_finished,
)
from tests.sandbox_broker.conftest import needs_bwrap
from tests.sandbox_broker.images_support import calc_repo_image

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap]

FIXED = "def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n"
PASSING_TEST = "import unittest\\n\\n\\nclass T(unittest.TestCase):\\n    def test_add(self):\\n        pass\\n"
# the route grades in a fresh sandbox from the agent's diff: the repository must be a git repository
GIT_INIT = "git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base"
RULES: dict[str, list[Any]] = {
    "MODE-GOLD": [f"```bash\nprintf '{FIXED}' > calc.py\n```", SUBMIT],
    "MODE-NOOP": [SUBMIT],
    "MODE-TAMPER": [f"```bash\nprintf '{PASSING_TEST}' > tests/test_calc.py\n```", SUBMIT],
    "MODE-SWAP-DIR": [f"```bash\nrm -rf tests; mkdir tests; printf '{PASSING_TEST}' > tests/test_calc.py\n```", SUBMIT],
    "WHERE": ["```bash\npwd > where.txt; echo $TASK_VAR >> where.txt\n```", SUBMIT],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("swe"), RULES, "swe") as fleet:
        image = calc_repo_image(fleet.state_dir / "img")
        template = {"name": "calc", "image": str(image), "host_usr": True}
        made = httpx.post(f"{fleet.broker.url}/templates", json=template, headers=bearer(ADMIN))
        assert made.status_code == 201, made.text
        fleet.start_worker(concurrency=8, ROLLOUT_WORKER_RETRY_BACKOFF_S="0.1")
        yield fleet


def _run(fleet: Fleet, job: str, body: dict[str, Any], path: str = "/rollouts") -> list[Any]:
    with fleet.client() as client:
        headers = create_job(client, job)
        response = client.post(path, json={"job": job, "group_size": 1, **body}, headers=headers)
        assert response.status_code == 202, response.text
        wait_finished(client, headers, response.json()["rollout_id"], timeout_s=120)
    return trajectories(fleet.redis_url, job)


def test_swe_route_scores_per_test_and_restores_the_tests(fleet: Fleet) -> None:
    def instance(mode: str) -> dict[str, Any]:
        return {"instance_id": f"calc__{mode.lower()}", "repo": "t/calc", "base_commit": "none",
                "problem_statement": f"MODE-{mode}: add() subtracts", "FAIL_TO_PASS": ["tests.test_calc.T.test_add"],
                "PASS_TO_PASS": ["test_sub (tests.test_calc.T)"]}  # fmt: skip

    body = {"instances": [instance(m) for m in ("GOLD", "NOOP", "TAMPER")], "template": "calc", "setup": [GIT_INIT],
            "test_command": "python3 -m unittest -v {modules}", "env": {"PYTHONDONTWRITEBYTECODE": "1"}}  # fmt: skip
    found = {t.task_id: t for t in _run(fleet, "swe", body, "/rollouts/swebench")}
    assert {k: (t.status, t.reward) for k, t in found.items()} == {
        "calc__gold": (Status.COMPLETED, 1.0), "calc__noop": (Status.COMPLETED, 0.0),
        "calc__tamper": (Status.COMPLETED, 0.0),  # its edit to the test file was undone before scoring
    }  # fmt: skip
    gold = found["calc__gold"].reward_details
    assert gold is not None and gold.tests["tests.test_calc.T.test_add"] == "PASSED"
    assert found["calc__gold"].timings.grade_s > 0  # graded in a fresh sandbox (the route's default)
    tamper = found["calc__tamper"].reward_details
    assert tamper is not None and tamper.dropped == ["tests/test_calc.py"]  # never taken from the agent
    metrics = httpx.get(f"{fleet.workers[0].url}/metrics").text
    assert 'rollout_worker_fresh_grades_total{outcome="applied"} 3.0' in metrics
    assert "rollout_worker_grade_change_max_bytes 1.6e+07" in metrics and "grade_dropped_paths_total 1.0" in metrics
    noop = found["calc__noop"].reward_details
    assert noop is not None and noop.tests == {"tests.test_calc.T.test_add": "FAILED",
                                               "test_sub (tests.test_calc.T)": "PASSED"}  # fmt: skip


def test_a_restored_directory_is_put_back_as_it_was(fleet: Fleet) -> None:
    """``restore: ["tests"]`` restores the directory (it used to be deleted: a false 0 for the gold
    patch); replacing the directory with a passing test does not count."""
    reward = {"command": "python3 -m unittest -v tests.test_calc", "restore": ["tests"]}
    tasks = [{"id": f"dir-{m.lower()}", "prompt": f"MODE-{m}", "sandbox": {"template": "calc"}, "reward": reward}
             for m in ("GOLD", "SWAP-DIR")]  # fmt: skip
    found = {t.task_id: (t.status, t.reward) for t in _run(fleet, "restore-dir", {"tasks": tasks})}
    assert found == {"dir-gold": (Status.COMPLETED, 1.0), "dir-swap-dir": (Status.COMPLETED, 0.0)}
    whole = {"id": "all", "prompt": "MODE-GOLD", "reward": {**reward, "restore": ["."]}}
    with fleet.client() as client:
        headers = create_job(client, "restore-all")
        refused = client.post("/rollouts", json={"job": "restore-all", "tasks": [whole]}, headers=headers)
    assert refused.status_code == 422 and "reward.restore" in refused.text, refused.text


def test_env_and_workdir_reach_every_command_and_the_reward(fleet: Fleet) -> None:
    sandbox = {"template": "calc", "workdir": "/tmp", "env": {"TASK_VAR": "v7"}}
    reward = 'test "$(cat where.txt)" = "$(printf "/tmp\\nv7")" && test "$TASK_VAR" = v7'
    task = {"id": "where", "prompt": "WHERE", "sandbox": sandbox, "reward": {"command": reward}}
    [traj] = _run(fleet, "where", {"tasks": [task]})
    assert (traj.status, traj.reward) == (Status.COMPLETED, 1.0), traj.reward_details


def test_a_reward_whose_interpreter_is_missing_is_an_infra_error(fleet: Fleet) -> None:
    tasks = [
        {"id": "no-python", "prompt": "MODE-NOOP", "sandbox": {"template": "calc"},
         "reward": {"command": "python3.99 -m unittest -v tests.test_calc"}},
        {"id": "no-runner", "prompt": "MODE-NOOP", "sandbox": {"template": "calc"},
         "reward": {"command": "python3 -m pytest -rA tests"}},  # no pytest in this image
    ]  # fmt: skip
    found = _run(fleet, "infra", {"tasks": tasks, "max_attempts": 2})
    assert len(found) == 2
    for traj in found:
        assert traj.status is Status.INFRA_ERROR, traj
        assert traj.infra is not None and traj.infra.stage is InfraStage.REWARD and traj.infra.attempts == 2

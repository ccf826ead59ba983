"""``command`` agents inside the task sandbox (the default ``where``), end to end with real processes
(Redis, scripted engine, proxy with the gateway, broker with local sandboxes, API, worker), with
host agents off as an operator leaves them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.protocol import Status, Trajectory
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, task, trajectories, wait_finished

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

RULES: dict[str, list[Any]] = {}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("sbfleet"), RULES, "sb") as fleet:
        fleet.start_worker(jobs=["inside"], concurrency=4)
        yield fleet


_HEADERS: dict[str, str] = {}


def _job(client: Any) -> dict[str, str]:
    if not _HEADERS:
        _HEADERS.update(create_job(client, "inside"))
    return _HEADERS


def run_one(fleet: Fleet, task_id: str, agent: dict[str, Any]) -> Trajectory:
    with fleet.client() as client:
        headers = _job(client)
        body = {"job": "inside", "group_size": 1, "agent": agent, "tasks": [task(task_id, "answer 42")]}
        rollout = submit(client, headers, body)
        wait_finished(client, headers, rollout, timeout_s=120)
    (traj,) = [t for t in trajectories(fleet.redis_url, "inside") if t.task_id == task_id]
    return traj


def test_a_command_agent_runs_inside_the_task_sandbox_as_its_user(fleet: Fleet) -> None:
    """Its files are the task's (the reward sees answer.txt), it is the sandbox's uid in its own
    pid namespace, and its environment holds the gateway's variables and no broker credentials."""
    script = "echo 42 > answer.txt; echo uid=$(id -u); echo pids=$(ls /proc | grep -c '^[0-9]'); env | sort"
    traj = run_one(fleet, "INSIDE", {"kind": "command", "argv": ["/bin/sh", "-c", script], "env": {"MINE": "1"}})
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    out = traj.agent.last_output
    assert "uid=1000" in out and "MINE=1" in out and "ROLLOUT_TASK=answer 42" in out, out
    assert "OPENAI_BASE_URL=" in out and "OPENAI_API_KEY=" in out, out
    assert "ROLLOUT_BROKER" not in out and "ROLLOUT_LEASE_ID" not in out and "ROLLOUT_REDIS" not in out, out
    pids = int(out.split("pids=")[1].split()[0])
    assert pids <= 6, out  # the sandbox's init, its exec agent, this shell and its pipeline: no host process


def test_the_output_tail_and_exit_status_are_recorded(fleet: Fleet) -> None:
    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; exit 3"
    traj = run_one(fleet, "TAIL", {"kind": "command", "argv": ["/bin/sh", "-c", script], "output_max_bytes": 300})
    assert traj.agent is not None and traj.agent.exit_code == 3, traj.agent
    assert traj.agent.last_output.endswith("line-2999\n") and len(traj.agent.last_output) <= 300


def test_a_host_agent_is_refused_at_submission_when_the_operator_did_not_allow_it(fleet: Fleet) -> None:
    with fleet.client() as client:
        headers = _job(client)
        for where in ("host", "beside"):
            agent = {"kind": "command", "argv": ["/bin/true"], "where": where}
            body = {"job": "inside", "group_size": 1, "tasks": [task("HOST", "x", agent=agent)]}
            response = client.post("/rollouts", json=body, headers=headers)
            assert response.status_code == 403, response.text
            error = response.json()["error"]
            assert (error["code"], error["field"]) == ("forbidden", "tasks.0.agent.where"), error

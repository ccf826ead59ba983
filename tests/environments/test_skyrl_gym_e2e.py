"""SkyRL-Gym environments through a real fleet (Redis, scripted engine, proxy, broker with local
sandboxes, API, worker): each row's ``env`` agent is stepped by the worker between LLM turns, and
every trajectory's reward equals what the package gives the same replies on its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.environments import skyrl_gym
from services.environments.skyrl_fixtures import REPLIES, ROWS, package_reward
from services.protocol import Status
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, trajectories, wait_finished

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("skyrl"), dict(REPLIES), "skyrl") as fleet:
        fleet.start_worker(jobs=["skyrl"], concurrency=4)
        yield fleet


def test_skyrl_gym_rewards_match_the_package(fleet: Fleet) -> None:
    tasks = skyrl_gym.tasks_from_rows(ROWS)
    body = {"job": "skyrl", "group_size": 1, "tasks": [t.model_dump(mode="json") for t in tasks]}
    with fleet.client() as client:
        headers = create_job(client, "skyrl")
        wait_finished(client, headers, submit(client, headers, body), timeout_s=120)
    by_task = {t.task_id: t for t in trajectories(fleet.redis_url, "skyrl")}
    assert sorted(by_task) == sorted(t.id for t in tasks)
    for data, task in zip(ROWS, tasks, strict=True):
        traj = by_task[task.id]
        expected, steps = package_reward(data, REPLIES[task.prompt.split(":")[0]])
        assert traj.status is Status.COMPLETED, (traj.status, traj.infra, traj.reward_details)
        assert traj.reward == expected, (task.id, traj.reward, traj.reward_details)
        assert traj.source == "skyrl-gym" and traj.source_version == task.source_version
        assert traj.agent is not None and traj.agent.kind == "env" and traj.agent.calls == steps
        assert len(traj.turns) == steps
        assert sum(traj.loss_mask) == sum(t.response_tokens for t in traj.turns) > 0
    assert by_task["skyrl-right"].reward == 1.0 and by_task["skyrl-wrong"].reward == 0.0

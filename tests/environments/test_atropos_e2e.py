"""Atropos environments (``BaseEnv`` subclasses from the real atroposlib) through a real fleet (Redis,
scripted engine, proxy, broker with local sandboxes, API, worker): each item's own
``collect_trajectories`` is stepped by the worker (its server calls are the episode's LLM turns), and
every trajectory's reward equals the score the environment gives the same replies on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from services.environments import atropos
from services.environments.atropos_fixtures import ITEMS, MODULE, REPLIES, package_reward
from services.protocol import Status
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, trajectories, wait_finished

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("atropos"), dict(REPLIES), "atropos") as fleet:
        fleet.start_worker(jobs=["atropos"], concurrency=4)
        yield fleet


def test_atropos_rewards_match_the_package(fleet: Fleet) -> None:
    config = {"tokenizer_name": str(fleet.model_path)}  # the policy's tokenizer, where the workers run
    tasks = atropos.tasks_from_environment(f"{MODULE}:Arithmetic", 2, config)
    tasks += atropos.tasks_from_environment(f"{MODULE}:ArithmeticRetry", 1, config)
    body = {"job": "atropos", "group_size": 1, "tasks": [t.model_dump(mode="json") for t in tasks]}
    with fleet.client() as client:
        headers = create_job(client, "atropos")
        wait_finished(client, headers, submit(client, headers, body), timeout_s=240)
    by_task = {t.task_id: t for t in trajectories(fleet.redis_url, "atropos")}
    assert sorted(by_task) == sorted(t.id for t in tasks)
    rewards = {}
    for task in tasks:
        traj, marker = by_task[task.id], task.prompt.split(":")[0]
        name = task.agent.env.rsplit(":", 1)[-1]  # type: ignore[union-attr]
        item = next(i for i in ITEMS[name] if i["question"] == task.prompt)
        assert traj.status is Status.COMPLETED, (traj.status, traj.infra, traj.reward_details)
        assert traj.reward == asyncio.run(package_reward(name, item, str(fleet.model_path))), task.id
        assert traj.source == "atropos" and traj.source_version == "atroposlib 0.4.0"
        assert traj.agent is not None and traj.agent.kind == "env" and traj.agent.calls == len(REPLIES[marker])
        assert len(traj.turns) == len(REPLIES[marker])
        assert sum(traj.loss_mask) == sum(t.response_tokens for t in traj.turns) > 0
        rewards[marker] = traj.reward
    assert rewards == {"ATROPOS-RIGHT": 1.0, "ATROPOS-WRONG": -1.0, "ATROPOS-RETRY": 0.5}

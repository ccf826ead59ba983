"""verifiers environments (``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv`` from the real package)
through a real fleet (Redis, scripted engine, proxy, broker with local sandboxes, API, worker): the
package's own rollout is stepped by the worker between LLM turns (its ``env_response`` and tools run
between them, its rubric scores the end), and every trajectory's reward equals what the package gives
the same replies on its own (its ``rollout`` and ``score_rollout`` called directly here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from services.environments import verifiers_env
from services.environments.verifiers_fixtures import ENV_ID, REPLIES, package_reward
from services.protocol import Status
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, trajectories, wait_finished

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]
KINDS = ("single", "multi", "tool")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("verifiers"), dict(REPLIES), "verifiers") as fleet:
        fleet.start_worker(jobs=["verifiers"], concurrency=4)
        yield fleet


def test_verifiers_rewards_match_the_package(fleet: Fleet) -> None:
    tasks = [t for kind in KINDS for t in verifiers_env.tasks_from_environment(ENV_ID, {"kind": kind})]
    tasks = [t.model_copy(update={"id": f"{t.agent.config['kind']}-{t.id}"}) for t in tasks]  # type: ignore[union-attr]
    body = {"job": "verifiers", "group_size": 1, "tasks": [t.model_dump(mode="json") for t in tasks]}
    with fleet.client() as client:
        headers = create_job(client, "verifiers")
        wait_finished(client, headers, submit(client, headers, body), timeout_s=240)
    by_task = {t.task_id: t for t in trajectories(fleet.redis_url, "verifiers")}
    assert sorted(by_task) == sorted(t.id for t in tasks)
    rewards = {}
    for task in tasks:
        traj, marker = by_task[task.id], task.prompt.split(":")[0]
        kind = task.id.split("-")[0]
        expected, turns = asyncio.run(package_reward(kind, marker))
        assert traj.status is Status.COMPLETED, (traj.status, traj.infra, traj.reward_details)
        assert traj.reward == expected, (task.id, traj.reward, traj.reward_details)
        assert traj.source == "verifiers" and traj.source_version == "verifiers 0.1.10"
        assert traj.agent is not None and traj.agent.kind == "env" and traj.agent.calls == turns
        assert len(traj.turns) == turns
        assert sum(traj.loss_mask) == sum(t.response_tokens for t in traj.turns) > 0
        rewards[marker] = traj.reward
    # right answer + format 1.2, wrong 0.25 (format only), three guesses 0.5, two tool calls then the answer 1.0
    assert rewards == {"VF-SINGLE-RIGHT": 1.2, "VF-SINGLE-WRONG": 0.25, "VF-MULTI": 0.5, "VF-TOOL": 1.0}

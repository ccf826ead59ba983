"""OpenEnv through a real fleet (Redis, scripted engine, proxy, broker with local sandboxes, API,
worker) and a real OpenEnv server (the package's ``create_app``, ``tests/environments/openenv_guess.py``):
each episode is one WebSocket session stepped by the worker between LLM turns; every trajectory's
reward equals what the package's environment gives the same replies on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from services.environments import openenv
from services.protocol import Cap, Status, Task
from services.protocol.agents import EnvAgent
from services.runtime.processes import ServiceProcess, start_service
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, trajectories, wait_finished

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

TARGETS = {"openenv-walk": 7, "openenv-first": 3, "openenv-lost": 9}
REPLIES: dict[str, list[str]] = {
    "openenv-walk": ["My guess is 5.", "Then 8.", "It is 7."],  # lower, higher, right: -0.1 -0.1 +1.0
    "openenv-first": ["3"],  # right at once: 1.0
    "openenv-lost": ["No idea."],  # never a number: -0.1 a turn until the turn cap
}
MAX_TURNS = 4


def package_reward(task_id: str) -> tuple[float, int]:
    """The package's environment itself (reset / step with typed actions) on the same replies."""
    # imported here, not at the top: OpenEnv's server imports would cost every xdist worker's collection
    from tests.environments.openenv_guess import GuessAction, GuessEnvironment

    env = GuessEnvironment()
    env.reset(target=TARGETS[task_id])
    rewards: list[float] = []
    replies = REPLIES[task_id]
    for turn in range(MAX_TURNS):
        observation = env.step(GuessAction(message=replies[min(turn, len(replies) - 1)]))
        rewards.append(float(observation.reward or 0.0))
        if observation.done:
            break
    return sum(rewards), len(rewards)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    args = ["-m", "uvicorn", "tests.environments.openenv_guess:app", "--port", "{port}", "--host", "127.0.0.1"]
    service = start_service(args, log_dir=tmp_path_factory.mktemp("openenv"), health_path="/health",
                            timeout_s=120, name="openenv")  # fmt: skip
    yield service
    service.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, server: ServiceProcess) -> Iterator[Fleet]:
    rules = {task_id.upper(): replies for task_id, replies in REPLIES.items()}
    with running_fleet(tmp_path_factory.mktemp("openenvfleet"), rules, "openenv") as fleet:
        fleet.start_worker(jobs=["openenv"], concurrency=4)
        yield fleet


def _tasks(url: str) -> list[Task]:
    prompts = {task_id: f"{task_id.upper()}: guess the number." for task_id in TARGETS}
    return openenv.tasks_for(url, prompts, reset={k: {"target": v} for k, v in TARGETS.items()})


def test_the_adapter_steps_a_session_as_the_package_does(server: ServiceProcess) -> None:
    (task,) = [t for t in _tasks(server.url) if t.id == "openenv-walk"]
    agent = task.agent
    assert isinstance(agent, EnvAgent)

    async def episode() -> tuple[list[float], list[str]]:
        env = openenv.open_environment(agent)
        first = await env.reset([{"role": "user", "content": task.prompt}])
        rewards, seen = [], [m["content"] for m in first]
        for reply in REPLIES["openenv-walk"]:
            step = await env.step(reply)
            rewards.append(step.reward)
            seen += [m["content"] for m in step.observations]
            if step.done:
                break
        await env.close()
        return rewards, seen

    rewards, seen = asyncio.run(episode())
    assert (sum(rewards), len(rewards)) == package_reward("openenv-walk")
    assert seen == [task.prompt, "Guess my number between 1 and 10.", "5 is wrong: go higher.", "8 is wrong: go lower."]


def test_openenv_rewards_match_the_package(fleet: Fleet, server: ServiceProcess) -> None:
    tasks = _tasks(server.url)
    body = {"job": "openenv", "group_size": 1, "limits": {"max_turns": MAX_TURNS},
            "tasks": [t.model_dump(mode="json") for t in tasks]}  # fmt: skip
    with fleet.client() as client:
        headers = create_job(client, "openenv")
        wait_finished(client, headers, submit(client, headers, body), timeout_s=120)
    by_task = {t.task_id: t for t in trajectories(fleet.redis_url, "openenv")}
    assert sorted(by_task) == sorted(TARGETS)
    for task in tasks:
        traj = by_task[task.id]
        expected, steps = package_reward(task.id)
        assert traj.reward == expected, (task.id, traj.reward, traj.reward_details, traj.infra)
        assert traj.source == "openenv" and traj.source_version == "openenv-core 0.3.0"
        assert traj.agent is not None and traj.agent.kind == "env" and len(traj.turns) == steps
        assert sum(traj.loss_mask) == sum(t.response_tokens for t in traj.turns) > 0
    assert by_task["openenv-walk"].status is Status.COMPLETED and by_task["openenv-first"].reward == 1.0
    lost = by_task["openenv-lost"]
    assert lost.status is Status.TRUNCATED and lost.truncation is Cap.TURNS and len(lost.turns) == MAX_TURNS

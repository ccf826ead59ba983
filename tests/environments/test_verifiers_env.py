"""verifiers environments (the real package) as tasks, and the adapter stepping the package's own
rollout (no fleet): rewards equal the package's own rollout + rubric on the same replies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from services.cli.main import main
from services.environments import verifiers_env
from services.environments.verifiers_fixtures import ENV_ID, REPLIES, ScriptedChat, package_reward
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_ADAPTERS, ENV_REWARD_COMMAND

CASES = [("single", "VF-SINGLE-RIGHT"), ("single", "VF-SINGLE-WRONG"), ("multi", "VF-MULTI"), ("tool", "VF-TOOL")]


def test_the_dataset_becomes_env_tasks() -> None:
    tasks = verifiers_env.tasks_from_environment(ENV_ID, {"kind": "single"})
    assert [t.id for t in tasks] == ["verifiers_fixtures-train-0", "verifiers_fixtures-train-1"]
    task = tasks[0]
    assert isinstance(task.agent, EnvAgent)
    assert task.agent.source == "verifiers" and task.agent.env == ENV_ID and task.agent.config == {"kind": "single"}
    assert [m["role"] for m in task.agent.messages] == ["system", "user"]
    assert task.agent.extras["answer"] == "42" and task.agent.extras["example_id"] == 0
    assert task.prompt.startswith("VF-SINGLE-RIGHT:")
    assert task.reward.command == ENV_REWARD_COMMAND and task.reward.parse_float
    assert task.source == "verifiers" and task.source_version == "verifiers 0.1.10"
    assert "verifiers" in ENV_ADAPTERS


async def _episode(kind: str, marker: str) -> tuple[list[float], list[list[dict[str, Any]]], list[dict[str, Any]]]:
    (task,) = [t for t in verifiers_env.tasks_from_environment(ENV_ID, {"kind": kind}) if t.prompt.startswith(marker)]
    assert isinstance(task.agent, EnvAgent)
    env = verifiers_env.open_environment(task.agent)
    replies = ScriptedChat(REPLIES[marker])  # the message the gateway gives: tool calls parsed from the markup
    rewards, observations = [], []
    try:
        await env.reset(list(task.agent.messages))
        for _ in REPLIES[marker]:
            completion = await replies.create()
            message = completion.choices[0].message.model_dump(exclude_none=True)
            step = await env.step(str(message.get("content") or ""), message)
            rewards.append(step.reward)
            observations.append(step.observations)
            if step.done:
                break
    finally:
        await env.close()
    return rewards, observations, env.tools


@pytest.mark.parametrize(("kind", "marker"), CASES)
def test_the_adapter_steps_the_package_rollout(kind: str, marker: str) -> None:
    rewards, observations, tools = asyncio.run(_episode(kind, marker))
    expected, turns = asyncio.run(package_reward(kind, marker))
    assert (sum(rewards), len(rewards)) == (expected, turns)
    assert rewards[:-1] == [0.0] * (turns - 1)  # the rubric scores the finished rollout
    assert observations[-1] == []
    if kind == "multi":
        assert [o[0]["content"] for o in observations[:-1]] == ["higher; guess again.", "lower; guess again."]
    if kind == "tool":
        assert sorted(t["function"]["name"] for t in tools) == ["add", "multiply"]
        assert [o[0]["role"] for o in observations[:-1]] == ["tool", "tool"]
        assert [o[0]["content"] for o in observations[:-1]] == ["5", "20"]
    else:
        assert tools == []


def test_a_package_error_is_raised_not_scored() -> None:
    async def episode() -> None:
        (task, _) = verifiers_env.tasks_from_environment(ENV_ID, {"kind": "single"})
        assert isinstance(task.agent, EnvAgent)
        env = verifiers_env.open_environment(task.agent)
        try:
            await env.reset(list(task.agent.messages))
            await env.step("")  # an empty reply: the package's EmptyModelResponseError ends the rollout
        finally:
            await env.close()

    with pytest.raises(RuntimeError, match="error"):
        asyncio.run(episode())


def test_close_before_the_end_cancels_the_rollout() -> None:
    async def episode() -> bool:
        (task,) = verifiers_env.tasks_from_environment(ENV_ID, {"kind": "multi"})
        assert isinstance(task.agent, EnvAgent)
        env = verifiers_env.open_environment(task.agent)
        await env.reset(list(task.agent.messages))
        await env.step("3")
        await env.close()
        return env.driven.task is not None and env.driven.task.cancelled()

    assert asyncio.run(episode())


def test_the_cli_writes_the_rollouts_body(tmp_path: Path) -> None:
    out = tmp_path / "body.json"
    args = ["tasks", "import", "verifiers", ENV_ID, "--env-args", '{"kind": "tool"}', "--job", "j", "--out", str(out)]
    assert main(args) == 0
    body = json.loads(out.read_text())
    assert body["job"] == "j" and body["group_size"] == 1
    (task,) = body["tasks"]
    assert task["agent"]["source"] == "verifiers" and task["agent"]["config"] == {"kind": "tool"}
    assert main(["tasks", "import", "verifiers", "no_such_environment_module", "--job", "j"]) == 2

"""Atropos environments (the real atroposlib) as tasks, and the adapter stepping the environment's own
``collect_trajectories`` (no fleet): rewards equal the environment's own score on the same replies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.cli.main import main
from services.environments import atropos
from services.environments.atropos_fixtures import ITEMS, MODULE, REPLIES, package_reward
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_ADAPTERS, ENV_REWARD_COMMAND
from services.runtime.tokenizer import write_tokenizer_dir

CASES = [("Arithmetic", "ATROPOS-RIGHT"), ("Arithmetic", "ATROPOS-WRONG"), ("ArithmeticRetry", "ATROPOS-RETRY")]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tokenizer_dir(tmp_path_factory.mktemp("atropos") / "model"))


def test_items_become_env_tasks(tokenizer: str) -> None:
    tasks = atropos.tasks_from_environment(f"{MODULE}:Arithmetic", 2, {"tokenizer_name": tokenizer})
    assert [t.id for t in tasks] == ["arithmetic-0", "arithmetic-1"]
    task = tasks[0]
    assert isinstance(task.agent, EnvAgent) and task.agent.source == "atropos"
    assert task.agent.env == f"{MODULE}:Arithmetic" and task.agent.config == {"tokenizer_name": tokenizer}
    assert task.agent.extras == {"item": {"question": "ATROPOS-RIGHT: What is 6 times 7?", "answer": "42"}}
    assert task.prompt == "ATROPOS-RIGHT: What is 6 times 7?"
    assert task.reward.command == ENV_REWARD_COMMAND and task.reward.parse_float
    assert task.source == "atropos" and task.source_version == "atroposlib 0.4.0"
    assert "atropos" in ENV_ADAPTERS


@pytest.mark.parametrize("path", ["services.environments.atropos_fixtures", "json:dumps", "services.protocol:Task"])
def test_only_a_base_env_subclass_is_loaded(path: str) -> None:
    with pytest.raises(ValueError, match=r"module:Class|BaseEnv"):
        atropos.environment_class(path)


async def _episode(agent: EnvAgent, marker: str) -> tuple[list[float], list[list[dict[str, str]]]]:
    env = atropos.open_environment(agent)
    rewards, observations = [], []
    try:
        await env.reset([])
        for reply in REPLIES[marker]:
            step = await env.step(reply)
            rewards.append(step.reward)
            observations.append(step.observations)
            if step.done:
                break
    finally:
        await env.close()
    return rewards, observations


@pytest.mark.parametrize(("name", "marker"), CASES)
def test_the_adapter_steps_collect_trajectories(name: str, marker: str, tokenizer: str) -> None:
    item = next(i for i in ITEMS[name] if i["question"].startswith(marker))
    tasks = atropos.tasks_from_environment(f"{MODULE}:{name}", 2, {"tokenizer_name": tokenizer})
    agent = next(t.agent for t in tasks if t.prompt.startswith(marker))
    assert isinstance(agent, EnvAgent)
    rewards, observations = asyncio.run(_episode(agent, marker))
    assert sum(rewards) == asyncio.run(package_reward(name, item, tokenizer))
    assert len(rewards) == len(REPLIES[marker]) and rewards[:-1] == [0.0] * (len(rewards) - 1)
    if name == "ArithmeticRetry":
        assert observations[0] == [{"role": "user", "content": "That is wrong; try again."}]


def test_a_group_call_is_an_error_not_a_score(tokenizer: str) -> None:
    (task,) = atropos.tasks_from_environment(f"{MODULE}:Arithmetic", 1, {"tokenizer_name": tokenizer})
    assert isinstance(task.agent, EnvAgent)
    # a config of its own: a separate environment object from the other tests' (one per class and config)
    spec = task.agent.model_copy(update={"config": {"tokenizer_name": tokenizer, "max_token_length": 511}})

    async def episode() -> None:
        env = atropos.open_environment(spec)
        env.env.config.group_size = 3  # as if the environment asked for a group itself
        try:
            await env.reset([])
        finally:
            await env.close()

    with pytest.raises(ValueError, match="n=3"):
        asyncio.run(episode())


def test_items_that_are_not_json_are_refused(tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.environments.atropos_fixture_envs import Arithmetic

    monkeypatch.setattr(Arithmetic, "items", [{"question": "q", "answer": {1, 2}}])
    with pytest.raises(ValueError, match="not JSON"):
        atropos.tasks_from_environment(f"{MODULE}:Arithmetic", 1, {"tokenizer_name": tokenizer})


def test_the_cli_writes_the_rollouts_body(tokenizer: str, tmp_path: Path) -> None:
    out = tmp_path / "body.json"
    config = json.dumps({"tokenizer_name": tokenizer})
    args = ["tasks", "import", "atropos", f"{MODULE}:ArithmeticRetry", "-n", "1", "--config", config, "--job", "j",
            "--group-size", "4", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    body = json.loads(out.read_text())
    assert (body["job"], body["group_size"], len(body["tasks"])) == ("j", 4, 1)
    assert body["tasks"][0]["agent"]["extras"]["item"]["answer"] == "17"
    assert main(["tasks", "import", "atropos", "json:dumps", "-n", "1", "--job", "j"]) == 2

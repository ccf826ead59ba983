"""SkyRL-Gym rows as tasks, and the adapter stepping the real package (no fleet)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from services.cli.main import main
from services.environments import skyrl_gym
from services.environments.skyrl_fixtures import REPLIES, ROWS, package_reward
from services.protocol.agents import AgentSpec, EnvAgent
from services.protocol.environments import ENV_ADAPTERS, ENV_REWARD_COMMAND


def test_rows_become_env_tasks_with_the_chat_and_extras() -> None:
    tasks = skyrl_gym.tasks_from_rows(ROWS)
    assert [t.id for t in tasks] == ["skyrl-right", "skyrl-wrong", "skyrl-multi"]
    multi = tasks[2]
    assert isinstance(multi.agent, EnvAgent)
    assert multi.agent.env == "gsm8k_multi_turn" and multi.agent.messages == ROWS[2]["prompt"]
    assert multi.agent.extras["reward_spec"] == {"method": "rule", "ground_truth": "42"}
    assert multi.agent.extras["extra_info"]["max_turns"] == 3
    assert multi.prompt.startswith("SKYRL-MULTI:")
    assert multi.reward.command == ENV_REWARD_COMMAND and multi.reward.parse_float
    assert multi.source == "skyrl-gym" and multi.source_version == "skyrl-gym 0.4.0"
    assert "skyrl-gym" in ENV_ADAPTERS


@pytest.mark.parametrize(
    ("bad", "field"), [({"env_class": ""}, "env_class"), ({"prompt": "text"}, "prompt"), ({"prompt": []}, "prompt")]
)
def test_rows_without_an_env_class_or_a_chat_are_refused(bad: dict[str, object], field: str) -> None:
    with pytest.raises(skyrl_gym.RowError, match=field):
        skyrl_gym.tasks_from_rows([{**ROWS[0], **bad}])


def test_an_unknown_source_is_refused_by_the_agent_spec() -> None:
    spec = TypeAdapter(AgentSpec)
    assert isinstance(spec.validate_python({"kind": "env", "source": "skyrl-gym", "env": "gsm8k"}), EnvAgent)
    with pytest.raises(ValidationError):
        spec.validate_python({"kind": "env", "source": "nope", "env": "gsm8k"})


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_the_adapter_steps_as_the_package_does(index: int) -> None:
    (task,) = skyrl_gym.tasks_from_rows([ROWS[index]])
    assert isinstance(task.agent, EnvAgent)
    marker = task.prompt.split(":")[0]

    async def episode() -> list[float]:
        env = skyrl_gym.open_environment(task.agent)  # type: ignore[arg-type]
        await env.reset(list(ROWS[index]["prompt"]))
        rewards = []
        for reply in REPLIES[marker]:
            step = await env.step(reply)
            rewards.append(step.reward)
            if step.done:
                break
            assert step.observations and step.observations[0]["role"] == "user"
        await env.close()
        return rewards

    rewards = asyncio.run(episode())
    assert (sum(rewards), len(rewards)) == package_reward(ROWS[index], REPLIES[marker])


def test_the_cli_writes_the_rollout_body(tmp_path: Path) -> None:
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "body.json"
    assert main(["tasks", "import", "skyrl-gym", str(rows), "--job", "j", "--out", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["job"] == "j" and [t["agent"]["env"] for t in body["tasks"]] == ["gsm8k", "gsm8k", "gsm8k_multi_turn"]
    assert body["tasks"] == [t.model_dump(mode="json") for t in skyrl_gym.tasks_from_rows(ROWS)]
    rows.write_text(json.dumps({"prompt": "no chat", "env_class": "gsm8k"}) + "\n")
    assert main(["tasks", "import", "skyrl-gym", str(rows), "--job", "j"]) == 2

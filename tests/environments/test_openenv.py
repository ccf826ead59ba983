"""OpenEnv tasks and observation text (no server)."""

from __future__ import annotations

import pytest

from services.environments import openenv
from services.protocol.agents import EnvAgent
from services.protocol.environments import ENV_ADAPTERS, ENV_REWARD_COMMAND


def test_tasks_name_the_server_and_the_mapping() -> None:
    (task,) = openenv.tasks_for("http://127.0.0.1:9", {"t1": "Guess."}, reset={"t1": {"target": 4}})
    assert (
        isinstance(task.agent, EnvAgent) and task.agent.source == "openenv" and task.agent.env == "http://127.0.0.1:9"
    )
    assert task.agent.config == {"action_key": "message", "observation_key": None, "reset": {"target": 4}}
    assert task.reward.command == ENV_REWARD_COMMAND and task.reward.parse_float
    assert task.source == "openenv" and task.source_version == "openenv-core 0.3.0"
    assert "openenv" in ENV_ADAPTERS


def test_a_server_not_named_by_url_is_refused() -> None:
    with pytest.raises(ValueError, match="URL"):
        openenv.tasks_for("echo_env", {"t1": "x"})


def test_observation_text() -> None:
    one = {"feedback": "go higher", "done": False, "reward": -0.1, "metadata": {"k": "v"}}
    assert openenv.observation_text(one, None) == "go higher"  # the one string field
    assert openenv.observation_text(one, "feedback") == "go higher"
    many = {"stdout": "4\n", "exit_code": 0, "stderr": ""}
    assert openenv.observation_text(many, None) == '{"exit_code": 0, "stderr": "", "stdout": "4\\n"}'
    assert openenv.observation_text(many, "stdout") == "4\n"
    assert openenv.observation_text({"done": True}, None) == ""

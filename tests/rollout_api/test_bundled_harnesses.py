"""Real harnesses from agent bundles, unmodified, inside the task sandbox through the forwarded
gateway: mini-swe-agent (PyPI, its default tool-calling ``mini.yaml``, the local environment: its
bash runs in the sandbox) and Claude Code (npm; Anthropic Messages as it sends them,
``/v1/messages?beta=true`` with ``thinking``: a thinking block and a ``Bash`` tool use). Each
finishes a task (the reward reads answer.txt in the sandbox), token-exact, the loss mask on exactly
the generated tokens. Bundles: see ``tests/rollout_api/bundled.py`` (skipped with the reason where
one cannot be built)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.benchmarks.bundled_harnesses import CLAUDE, MINI, QUIET
from services.protocol import Status, Trajectory
from services.runtime.chat import ChatTemplate
from tests.rollout_api.bundled import Harnesses, harnesses, hermes

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]  # bundles built once per machine

WRITE = "echo 42 > answer.txt"
THOUGHT = "<think>\nI should write the answer.\n</think>\n\n"
RULES: dict[str, list[Any]] = {
    "MSWEA-INSIDE": [
        "I will write the answer.\n" + hermes("bash", {"command": WRITE}),
        hermes("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
    "CLAUDE-INSIDE": [
        THOUGHT + "I will write it.\n" + hermes("Bash", {"command": WRITE, "description": "Write the answer"}),
        "Done.",
    ],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harnesses]:
    with harnesses(tmp_path_factory.mktemp("harness"), RULES, ["mini-swe-agent", "claude-code"]) as fleet:
        yield fleet


def run(fleet: Harnesses, name: str, script: str, task_id: str) -> Trajectory:
    digest = fleet.bundle(name)
    agent = {"kind": "command", "bundle": name, "argv": ["/bin/sh", "-c", script], "env": QUIET}
    traj = fleet.run(task_id, agent)
    assert traj.agent is not None, traj.infra
    assert traj.agent.exit_code == 0, (traj.infra, traj.agent.exit_code, traj.agent.last_output[-3000:])
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, (traj.infra, traj.reward_details)
    assert (traj.agent.bundle, traj.agent.bundle_digest) == (name, digest)
    return traj


def test_mini_swe_agent_from_its_bundle_finishes_a_task_token_exact(fleet: Harnesses) -> None:
    traj = run(fleet, "mini-swe-agent", MINI, "MSWEA-INSIDE")
    assert traj.agent is not None and traj.agent.calls == 2
    fleet.token_exact(traj)
    chat = ChatTemplate.from_dir(fleet.fleet.model_path)
    generated = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert chat.decode(generated).count("<tool_call>") == 2


def test_claude_code_from_its_bundle_finishes_a_task_with_thinking_token_exact(fleet: Harnesses) -> None:
    traj = run(fleet, "claude-code", CLAUDE, "CLAUDE-INSIDE")
    assert traj.agent is not None
    assert "Done." in traj.agent.last_output, traj.agent.last_output  # stdout and stderr interleave
    calls = fleet.calls(traj.agent.session)
    assert [c.route for c in calls] == ["messages", "messages"] and [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True]
    # Messages as Claude Code sends them: /v1/messages?beta=true with thinking
    assert {"?beta", "thinking", "context_management", "metadata"} <= set(calls[0].unused_fields)
    context = fleet.token_exact(traj)
    (used,) = [m for m in context["messages"] if m.get("tool_calls")]
    assert used["content"] == THOUGHT + "I will write it."  # its thinking block came back verbatim
    assert used["tool_calls"][0]["function"]["arguments"]["command"] == WRITE

"""The real Codex CLI, Gemini CLI, Qwen Code, opencode and aider, unmodified, from their agent
bundles (``rollout agents install``: npm, npm, npm, npm, PyPI), each finishing a task inside the
task sandbox through its own gateway session (the socket-forwarded ``127.0.0.1`` base URL): each
writes the answer with its own tool or edit, inside the sandbox (the reward reads answer.txt
there), and its trajectory is token-exact (one segment; opencode's title call is a segment of its
own) with the loss mask on exactly the generated tokens. Each also checks a dialect detail it
relies on: Codex's streamed ``function_call`` over Responses, Gemini CLI's ``functionResponse``.
The commands are those of docs/agents.md's harness table
(``services/benchmarks/bundled_harnesses.py``). Bundles: see ``tests/rollout_api/bundled.py``
(skipped with the reason where one cannot be built)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.benchmarks.bundled_harnesses import AIDER, CODEX, GEMINI, OPENCODE, QUIET, QWEN
from services.protocol import Status
from tests.rollout_api.bundled import Harnesses, harnesses, hermes

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]  # bundles built once per machine

WRITE = "echo 42 > answer.txt"
RULES: dict[str, list[Any]] = {
    "CODEX-INSIDE": ["I will write it.\n" + hermes("exec_command", {"cmd": WRITE}), "Done."],
    "GEMINI-INSIDE": ["I will write it.\n" + hermes("run_shell_command", {"command": WRITE}), "Done."],
    "QWEN-INSIDE": [
        "(its own first turn)",
        "I will write it.\n" + hermes("run_shell_command", {"command": WRITE}),
        "Done.",
    ],  # Qwen Code's first request already holds an assistant turn
    "OPENCODE-INSIDE": ["I will write it.\n" + hermes("bash", {"command": WRITE, "description": "Write it"}), "Done."],
    "AIDER-INSIDE": ["I will write it down.\n\nanswer.txt\n```\n42\n```"],  # aider's "whole" edit format
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harnesses]:
    with harnesses(
        tmp_path_factory.mktemp("clis"), RULES, ["codex", "gemini-cli", "aider", "qwen-code", "opencode"]
    ) as fleet:
        yield fleet


def run(fleet: Harnesses, name: str, script: str, task_id: str) -> Any:
    digest = fleet.bundle(name)
    agent = {"kind": "command", "bundle": name, "argv": ["/bin/sh", "-c", script], "env": QUIET}
    traj = fleet.run(task_id, agent)
    assert traj.agent is not None, traj.infra
    assert traj.agent.exit_code == 0, (traj.infra, traj.agent.exit_code, traj.agent.last_output[-3000:])
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, (traj.infra, traj.reward_details)
    assert (traj.agent.bundle, traj.agent.bundle_digest) == (name, digest)
    return traj


def test_codex_from_its_bundle_finishes_a_task_in_the_sandbox_token_exact(fleet: Harnesses) -> None:
    traj = run(fleet, "codex", CODEX, "CODEX-INSIDE")
    assert "Done." in traj.agent.last_output, traj.agent.last_output[-2000:]  # stdout and stderr interleave
    calls = fleet.calls(traj.agent.session)
    assert [c.route for c in calls] == ["responses", "responses"] and [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True]
    context = fleet.token_exact(traj)
    (streamed,) = [m for m in context["messages"] if m.get("tool_calls")]  # the function_call it was streamed
    assert streamed["tool_calls"][0]["function"] == {"name": "exec_command", "arguments": {"cmd": WRITE}}
    assert [m["role"] for m in context["messages"]].count("tool") == 1  # and its function_call_output


def test_gemini_cli_from_its_bundle_finishes_a_task_in_the_sandbox_token_exact(fleet: Harnesses) -> None:
    traj = run(fleet, "gemini-cli", GEMINI, "GEMINI-INSIDE")
    assert "Done." in traj.agent.last_output, traj.agent.last_output[-2000:]  # stdout and stderr interleave
    calls = fleet.calls(traj.agent.session)
    assert [c.route for c in calls] == ["gemini", "gemini"] and [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True]
    context = fleet.token_exact(traj)
    (call,) = [m for m in context["messages"] if m.get("tool_calls")]
    assert call["tool_calls"][0]["function"] == {"name": "run_shell_command", "arguments": {"command": WRITE}}
    (response,) = [m for m in context["messages"] if m["role"] == "tool"]  # its functionResponse
    assert response["content"], context["messages"]


def test_aider_from_its_bundle_finishes_a_task_in_the_sandbox_token_exact(fleet: Harnesses) -> None:
    traj = run(fleet, "aider", AIDER, "AIDER-INSIDE")
    calls = fleet.calls(traj.agent.session)
    assert [c.route for c in calls] == ["chat"]
    context = fleet.token_exact(traj)
    assert context["reply"]["content"].endswith("answer.txt\n```\n42\n```")


def test_qwen_code_from_its_bundle_finishes_a_task_in_the_sandbox_token_exact(fleet: Harnesses) -> None:
    traj = run(fleet, "qwen-code", QWEN, "QWEN-INSIDE")
    assert "Done." in traj.agent.last_output, traj.agent.last_output[-2000:]
    calls = fleet.calls(traj.agent.session)
    assert [c.route for c in calls] == ["chat", "chat"] and [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True]
    context = fleet.token_exact(traj)
    (call,) = [m for m in context["messages"] if m.get("tool_calls")]
    assert call["tool_calls"][0]["function"] == {"name": "run_shell_command", "arguments": {"command": WRITE}}
    assert [m["role"] for m in context["messages"]].count("tool") == 1


def test_opencode_from_its_bundle_finishes_a_task_in_the_sandbox_token_exact(fleet: Harnesses) -> None:
    """opencode first asks for a title (no tools: a segment of its own), then works the task."""
    traj = run(fleet, "opencode", OPENCODE, "OPENCODE-INSIDE")
    assert "Done." in traj.agent.last_output, traj.agent.last_output[-2000:]
    calls = fleet.calls(traj.agent.session)
    assert [c.route for c in calls] == ["chat"] * 3, calls
    # opencode forks the title call beside its loop, so either may reach the gateway first
    segments = {c.segment: [(k.tool_calls, k.merged) for k in calls if k.segment == c.segment] for c in calls}
    assert sorted(segments.values(), key=len) == [[(0, False)], [(1, False), (0, True)]], segments
    context = fleet.token_exact(traj, segments=2)
    (call,) = [m for m in context["messages"] if m.get("tool_calls")]
    assert call["tool_calls"][0]["function"]["name"] == "bash"
    assert call["tool_calls"][0]["function"]["arguments"]["command"] == WRITE

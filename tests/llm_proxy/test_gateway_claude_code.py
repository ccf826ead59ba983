"""The real Claude Code (``@anthropic-ai/claude-code@2.1.328`` from npm, unmodified) against a
gateway session over Anthropic Messages (``/v1/messages?beta=true``, streaming, 12 tools,
``thinking``): a thinking block and a ``Bash`` tool use that Claude Code runs, then its answer,
recorded as one token-exact segment (the thinking block passed back re-renders as sampled).
Skipped, saying why, where npm is missing or cannot install the package (no registry).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.benchmarks.harnesses import HARNESSES, Episode
from services.protocol import keys
from services.protocol.gateway import segments_from_calls
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.gateway_fleet import GatewayFleet, gateway_fleet
from tests.llm_proxy.npm_harness import npm_binary

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]  # an install, a fleet, a harness run

VERSION = "2.1.328"
THOUGHT = "<think>\nI should list them.\n</think>\n\n"
BASH = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls", "description": "List files"}}\n</tool_call>'
TASK = "List the files here."
RULES = {"List the files here": [THOUGHT + "I will list them.\n" + BASH, "There are two files."]}


@pytest.fixture(scope="module")
def claude() -> Path:
    return npm_binary("@anthropic-ai/claude-code", VERSION, "claude")


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with gateway_fleet(redis_server.url, tmp_path_factory.mktemp("claude-code"), RULES) as fleet:
        yield fleet


def test_claude_code_tool_use_with_thinking_is_token_exact(claude: Path, fleet: GatewayFleet, tmp_path: Path) -> None:
    sid, token = fleet.session(max_trajectory_tokens=500_000)  # Claude Code's system prompt and 12 tools: ~50 KB
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a")
    (work / "b.txt").write_text("b")
    spec = HARNESSES["claude-code"].launch(str(claude), Episode(fleet.proxy.url, sid, token, tmp_path, work, TASK))
    run = subprocess.run(spec.argv, env={**os.environ, **spec.env}, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=90)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("There are two files.")

    calls = fleet.calls(sid)
    assert [c.route for c in calls] == ["messages", "messages"]
    assert [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
    assert {"thinking", "context_management", "output_config", "metadata"} <= set(calls[0].unused_fields)

    context: dict[str, Any] = json.loads(fleet.redis.get(keys.gateway_context(sid)) or b"{}")
    messages, reply, tools = context["messages"], context["reply"], context["tools"]
    assert len(tools) == 12 and "Bash" in {t["function"]["name"] for t in tools}
    (used,) = [m for m in messages if m.get("tool_calls")]
    assert used["content"] == THOUGHT + "I will list them."  # the thinking block came back verbatim
    assert used["tool_calls"][0]["function"]["arguments"]["command"] == "ls"
    (result,) = [m for m in messages if m["role"] == "tool"]
    assert "a.txt" in result["content"] and "b.txt" in result["content"]  # Claude Code ran the call

    (segment,) = segments_from_calls(calls)
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render([*messages, reply], False, tools))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert sum(segment.loss_mask) == len(generated)

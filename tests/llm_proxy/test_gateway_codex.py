"""The real Codex CLI (``@openai/codex@0.169.0`` from npm, unmodified) against a gateway session
over OpenAI Responses: a streamed function call (``exec_command``) that Codex runs, then its
answer, recorded as one token-exact segment. Skipped, saying why, where npm is missing or cannot
install the package (no registry).

Codex 0.169.0 also offers a ``namespace`` tool (its sub-agents) and the hosted ``web_search``, which
a chat template cannot render (the gateway refuses them, naming them); the run turns both off
(``--disable multi_agent``, ``web_search="disabled"``) and leaves Codex's own sandbox out
(``--dangerously-bypass-approvals-and-sandbox``: the task sandbox is the isolation).
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

VERSION = "0.169.0"
EXEC = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call>'
TASK = "List the files here."
RULES = {"List the files here": ["I will list them.\n" + EXEC, "There are two files."]}


@pytest.fixture(scope="module")
def codex() -> Path:
    return npm_binary("@openai/codex", VERSION, "codex")


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with gateway_fleet(redis_server.url, tmp_path_factory.mktemp("codex"), RULES) as fleet:
        yield fleet


def test_codex_cli_streamed_function_call_round_trip_is_token_exact(
    codex: Path, fleet: GatewayFleet, tmp_path: Path
) -> None:
    sid, token = fleet.session(max_trajectory_tokens=500_000)  # Codex's instructions and 8 tools: ~40 KB
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a")
    (work / "b.txt").write_text("b")
    spec = HARNESSES["codex"].launch(str(codex), Episode(fleet.proxy.url, sid, token, tmp_path, work, TASK))
    run = subprocess.run(spec.argv, env={**os.environ, **spec.env}, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=90)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("There are two files.")

    calls = fleet.calls(sid)
    assert [c.route for c in calls] == ["responses", "responses"]
    assert [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
    assert "store" in calls[0].unused_fields and "prompt_cache_key" in calls[0].unused_fields

    context: dict[str, Any] = json.loads(fleet.redis.get(keys.gateway_context(sid)) or b"{}")
    messages, reply, tools = context["messages"], context["reply"], context["tools"]
    assert len(tools) == 7 and {t["function"]["name"] for t in tools} >= {"exec_command", "write_stdin"}
    (fc,) = [m for m in messages if m.get("tool_calls")]
    assert fc["tool_calls"][0]["function"] == {"name": "exec_command", "arguments": {"cmd": "ls"}}
    (result,) = [m for m in messages if m["role"] == "tool"]
    assert "a.txt" in result["content"] and "b.txt" in result["content"]  # Codex ran the streamed call

    (segment,) = segments_from_calls(calls)
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render([*messages, reply], False, tools))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert sum(segment.loss_mask) == len(generated)

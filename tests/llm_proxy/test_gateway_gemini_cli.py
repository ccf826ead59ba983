"""The real Gemini CLI (``@google/gemini-cli@0.61.0`` from npm, unmodified) against a gateway
session over the Gemini API (``GOOGLE_GEMINI_BASE_URL``): a ``run_shell_command`` function call
that Gemini CLI runs, its ``functionResponse``, then the answer, recorded as one token-exact
segment. Skipped, saying why, where npm is missing or cannot install the package (no registry).
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

VERSION = "0.61.0"
SHELL = '<tool_call>\n{"name": "run_shell_command", "arguments": {"command": "ls"}}\n</tool_call>'
TASK = "List the files here."
RULES = {"List the files here": ["I will list them.\n" + SHELL, "There are two files."]}


@pytest.fixture(scope="module")
def gemini() -> Path:
    return npm_binary("@google/gemini-cli", VERSION, "gemini")


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with gateway_fleet(redis_server.url, tmp_path_factory.mktemp("gemini-cli"), RULES) as fleet:
        yield fleet


def test_gemini_cli_function_response_round_trip_is_token_exact(
    gemini: Path, fleet: GatewayFleet, tmp_path: Path
) -> None:
    sid, token = fleet.session(max_trajectory_tokens=500_000)  # Gemini CLI's instructions and 15 tools
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a")
    (work / "b.txt").write_text("b")
    spec = HARNESSES["gemini-cli"].launch(str(gemini), Episode(fleet.proxy.url, sid, token, tmp_path, work, TASK))
    run = subprocess.run(spec.argv, env={**os.environ, **spec.env}, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=90)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("There are two files.")

    calls = fleet.calls(sid)
    assert [c.route for c in calls] == ["gemini", "gemini"]
    assert [c.tool_calls for c in calls] == [1, 0]
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)

    context: dict[str, Any] = json.loads(fleet.redis.get(keys.gateway_context(sid)) or b"{}")
    messages, reply, tools = context["messages"], context["reply"], context["tools"]
    assert "run_shell_command" in {t["function"]["name"] for t in tools}
    (result,) = [m for m in messages if m["role"] == "tool"]
    assert "a.txt" in result["content"] and "b.txt" in result["content"]  # Gemini CLI's functionResponse

    (segment,) = segments_from_calls(calls)
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render([*messages, reply], False, tools))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert sum(segment.loss_mask) == len(generated)

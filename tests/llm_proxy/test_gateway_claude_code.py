"""The real Claude Code (``@anthropic-ai/claude-code@2.1.328`` from npm, unmodified) against a
gateway session over Anthropic Messages (``/v1/messages?beta=true``, streaming, 12 tools,
``thinking``): a thinking block and a ``Bash`` tool use that Claude Code runs, then its answer,
recorded as one token-exact segment (the thinking block passed back re-renders as sampled;
``tests/llm_proxy/cli_harness.py``). Skipped, saying why, where npm is missing or cannot install
the package (no registry).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.cli_harness import Cli, cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]  # an install, a fleet, a harness run


@pytest.fixture(scope="module")
def claude(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    with cli("claude-code", redis_server.url, tmp_path_factory.mktemp("claude-code")) as harness:
        yield harness


def test_claude_code_tool_use_with_thinking_is_token_exact(claude: Cli, tmp_path: Path) -> None:
    run = claude.run(tmp_path)
    assert {"?beta", "thinking", "context_management", "output_config", "metadata"} <= set(run.calls[0].unused_fields)
    assert len(run.tools) == 12
    (used,) = [m for m in run.messages if m.get("tool_calls")]
    assert used["content"] == claude.first_reply and "<think>" in used["content"]  # the thinking block, verbatim
    assert used["tool_calls"][0]["function"]["arguments"]["command"] == "ls"

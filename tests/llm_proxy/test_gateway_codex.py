"""The real Codex CLI (``@openai/codex@0.169.0`` from npm, unmodified) against a gateway session
over OpenAI Responses: a streamed function call (``exec_command``) that Codex runs, then its
answer, recorded as one token-exact segment (``tests/llm_proxy/cli_harness.py``). Skipped, saying
why, where npm is missing or cannot install the package (no registry).

Codex 0.169.0 also offers a ``namespace`` tool (its sub-agents) and the hosted ``web_search``, which
a chat template cannot render (the gateway refuses them, naming them); the run turns both off
(``--disable multi_agent``, ``web_search="disabled"``) and leaves Codex's own sandbox out
(``--dangerously-bypass-approvals-and-sandbox``: the task sandbox is the isolation).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.cli_harness import Cli, cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]  # an install, a fleet, a harness run


@pytest.fixture(scope="module")
def codex(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    with cli("codex", redis_server.url, tmp_path_factory.mktemp("codex")) as harness:
        yield harness


def test_codex_cli_streamed_function_call_round_trip_is_token_exact(codex: Cli, tmp_path: Path) -> None:
    run = codex.run(tmp_path)
    assert "store" in run.calls[0].unused_fields and "prompt_cache_key" in run.calls[0].unused_fields
    assert len(run.tools) == 7 and {t["function"]["name"] for t in run.tools} >= {"exec_command", "write_stdin"}
    (streamed,) = [m for m in run.messages if m.get("tool_calls")]  # the function call it was streamed
    assert streamed["tool_calls"][0]["function"] == {"name": "exec_command", "arguments": {"cmd": "ls"}}

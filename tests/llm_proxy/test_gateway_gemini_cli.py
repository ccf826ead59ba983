"""The real Gemini CLI (``@google/gemini-cli@0.61.0`` from npm, unmodified) against a gateway
session over the Gemini API (``GOOGLE_GEMINI_BASE_URL``): a ``run_shell_command`` function call
that Gemini CLI runs, its ``functionResponse``, then the answer, recorded as one token-exact
segment (``tests/llm_proxy/cli_harness.py``). Skipped, saying why, where npm is missing or cannot
install the package (no registry).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.cli_harness import Cli, cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]  # an install, a fleet, a harness run


@pytest.fixture(scope="module")
def gemini(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    with cli("gemini-cli", redis_server.url, tmp_path_factory.mktemp("gemini-cli")) as harness:
        yield harness


def test_gemini_cli_function_response_round_trip_is_token_exact(gemini: Cli, tmp_path: Path) -> None:
    run = gemini.run(tmp_path)
    (call,) = [m for m in run.messages if m.get("tool_calls")]
    assert call["tool_calls"][0]["function"] == {"name": "run_shell_command", "arguments": {"command": "ls"}}
    (response,) = [m for m in run.messages if m["role"] == "tool"]  # its functionResponse, as Gemini CLI wraps it
    assert "Output: a.txt\nb.txt" in response["content"]

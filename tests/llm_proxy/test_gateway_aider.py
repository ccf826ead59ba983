"""aider (``aider-chat`` from PyPI, unmodified, in a virtual environment of its own) through a
gateway session over chat completions, with litellm's ``api_base`` at the session: it writes a
draft with its "whole" edit format, its test command fails, it sends the failure back, and it
writes the answer. aider moves its format reminder to the newest user message on every call, so
the second call rewrites the history: it is recorded as a second segment, each token-exact (the
ids the gateway recorded are those the engine was given and generated, seen through a recording
relay), and the last one equals the chat template over the conversation aider sent.

Skipped, saying why, where aider cannot be installed here (no registry, or not within the limit);
the install (about 75-85 s on a loaded 2-core machine) is made once per machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.benchmarks.agents import TASKS, Stack, run_episode, stack
from services.benchmarks.harnesses import AIDER, HARNESSES
from services.benchmarks.npm_harness import HarnessUnavailable
from services.benchmarks.pip_harness import venv_binary
from services.protocol import keys
from services.runtime.chat import ChatTemplate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]  # a one-time install, a stack, a run

HARNESS = HARNESSES["aider"]


@pytest.fixture(scope="module")
def aider() -> str:
    try:
        return str(venv_binary("aider-chat", AIDER, "aider", install_s=200))
    except HarnessUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    tmp = tmp_path_factory.mktemp("aider")
    with stack(tmp, [HARNESS], 1) as st:
        yield st, tmp


def test_aider_history_rewrite_becomes_token_exact_segments(aider: str, fleet: tuple[Stack, Path]) -> None:
    st, tmp = fleet
    episode = run_episode(st, HARNESS, aider, TASKS[0], tmp, timeout_s=50)
    assert episode["error"] == ""
    calls = episode["calls"]
    assert [c.route for c in calls] == ["chat", "chat"] and [c.segment for c in calls] == [0, 1]
    assert not any(c.merged or c.mismatch for c in calls)
    assert episode["exact"] == [True, True]  # recorded == what the engine was given and generated

    context: dict[str, Any] = json.loads(st.redis.get(keys.gateway_context(episode["sid"])) or b"{}")
    messages, reply = context["messages"], context["reply"]
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert any("grep -q draft ANSWER.txt" in u for u in users)  # aider sent its test's failure back
    assert "To suggest changes to a file" in users[-1]  # the reminder rides on the newest user message
    assert reply["content"].endswith("There are two files.\n```")

    chat = ChatTemplate.from_dir(tmp / "tokenizer")
    last = calls[-1]
    held = [*last.prompt_ids, *last.output_ids]
    rendered = chat.encode(chat.render([*messages, reply], False, None))
    assert rendered[: len(held)] == held and rendered[len(held) :] == chat.encode("\n")

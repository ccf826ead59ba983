"""Anthropic Messages on the agent gateway as Claude Code sends them (``?beta=true``, the
``anthropic-beta`` header, ``thinking``, ``context_management``, ``output_config``, ``metadata``),
with real processes and the real anthropic SDK: thinking blocks from the model's reasoning, a
tool-use exchange recorded as one token-exact segment, ``count_tokens`` with the pool's tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.protocol.gateway import segments_from_calls
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.gateway_fleet import GatewayFleet, gateway_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

THOUGHT = "<think>\nI should list them.\n</think>\n\n"
LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
RULES = {"find the files": [THOUGHT + "Let me look.\n" + LS, "There are two files."]}
BASH: Any = {
    "name": "bash",
    "description": "Run a command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
SYSTEM: Any = [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]
CLAUDE_CODE: dict[str, Any] = {  # what Claude Code 2.1.328 sends besides model, messages, system, tools
    "max_tokens": 32_000,
    "metadata": {"user_id": "user_0123"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "extra_query": {"beta": "true"},
    "extra_headers": {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
    "extra_body": {
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    },
}


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with gateway_fleet(redis_server.url, tmp_path_factory.mktemp("claude"), RULES) as fleet:
        yield fleet


def test_claude_code_shaped_tool_use_with_thinking_is_one_token_exact_segment(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.anthropic(sid, token)
    ask: Any = {"role": "user", "content": [{"type": "text", "text": "Please find the files."}]}
    with client.messages.stream(model="policy", messages=[ask], system=SYSTEM, tools=[BASH], **CLAUDE_CODE) as stream:
        first = stream.get_final_message()
    thinking, text, use = first.content
    assert thinking.type == "thinking" and thinking.thinking == "I should list them." and thinking.signature
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.input == {"command": "ls -la"} and first.stop_reason == "tool_use"

    follow: list[Any] = [
        ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt\nb.txt"}]},
    ]
    counted = client.messages.count_tokens(
        model="policy",
        messages=follow,
        system=SYSTEM,
        tools=[BASH],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_query={"beta": "true"},
    )
    with client.messages.stream(model="policy", messages=follow, system=SYSTEM, tools=[BASH], **CLAUDE_CODE) as stream:
        second = stream.get_final_message()
    assert [b.type for b in second.content] == ["text"] and second.content[0].text == "There are two files."

    calls = fleet.calls(sid)
    assert [c.route for c in calls] == ["messages", "messages"]
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
    assert {"?beta", "thinking", "metadata", "context_management", "output_config"} <= set(calls[0].unused_fields)
    assert counted.input_tokens == len(calls[1].prompt_ids)
    (segment,) = segments_from_calls(calls)
    template_tool = {
        "type": "function",
        "function": {"name": "bash", "description": "Run a command", "parameters": BASH["input_schema"]},
    }
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la"}}}
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Please find the files."},
        {"role": "assistant", "content": THOUGHT + "Let me look.", "tool_calls": [call]},
        {"role": "tool", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "There are two files."},
    ]
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render(conversation, False, [template_tool]))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert sum(segment.loss_mask) == len(generated)


def test_without_thinking_the_reasoning_stays_in_the_text(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    body = {"model": "policy", "max_tokens": 100, "messages": [{"role": "user", "content": "find the files"}]}
    answer = httpx.post(
        fleet.anthropic_url(sid) + "/v1/messages?beta=true", json=body, headers={"x-api-key": token}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    (text,) = answer.json()["content"]
    assert text["type"] == "text" and text["text"].startswith(THOUGHT)

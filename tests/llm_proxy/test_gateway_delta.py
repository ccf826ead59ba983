"""Rendering only the new messages: the same ids as a full render for a local template, a mismatch
counted when the reply does not re-render as sampled, and non-local templates rendered whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.llm_proxy.gateway.delta import extend, is_local
from services.llm_proxy.gateway.tokens import Context, plan_chat
from services.runtime.chat import ChatTemplate, bundled_chat_template, compile_template
from services.runtime.tokenizer import CHAT_TEMPLATE
from tests.support.tokenizers import write_metaspace_dir

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {}}}]
# Qwen3's rule, reduced: reasoning is dropped from assistant turns before the last user message
STRIPS_REASONING = CHAT_TEMPLATE.replace(
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}",
    "{%- else %}{%- set ns = namespace(last=0) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- set text = message['content'] %}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last %}{%- set text = text.split('</think>')[-1] %}"
    "{%- endif %}{{- '<|im_start|>' + message['role'] + '\\n' + text + '<|im_end|>\\n' }}",
)


def _turn(chat: ChatTemplate, messages: list[dict[str, Any]], last: Context | None, reply: str, local: bool) -> Any:
    plan = plan_chat(chat, messages, TOOLS, last, 0 if last is None else last.segment + 1, local=local)
    output = [*chat.encode(reply), chat.eos_id]
    context = Context(messages=messages, reply={"role": "assistant", "content": reply}, tools=TOOLS,
                      segment=plan.segment, held=[*plan.prompt_ids, *output], ended_with_eos=True,
                      output_ids=output)  # fmt: skip
    return plan, context


def _episode(chat: ChatTemplate, local: bool, replies: list[str]) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Agent."}, {"role": "user", "content": "task"}]
    plans, last = [], None
    for n, reply in enumerate(replies):
        plan, last = _turn(chat, messages, last, reply, local)
        plans.append(plan)
        messages = [*messages, {"role": "assistant", "content": reply}, {"role": "tool", "content": f"out {n}"}]
    return plans


def _metaspace_chat(directory: Path) -> ChatTemplate:
    """A SentencePiece-style tokenizer that marks the start of an input, with the bundled template."""
    return ChatTemplate.from_dir(write_metaspace_dir(directory))


@pytest.mark.parametrize(
    ("chat_of", "replies"),
    [
        (lambda _: bundled_chat_template(), ["look", "<think>\nhm\n</think>\n\nrun ls", "done"]),
        # encoded alone, the delta would start with the word boundary such a tokenizer puts at the
        # start of an input; in the full render it follows the end of turn and has none
        (_metaspace_chat, ["look", "run ls", "done"]),
    ],
    ids=["bundled", "metaspace"],
)
def test_delta_rendering_gives_the_full_render_ids(
    chat_of: Callable[[Path], ChatTemplate], replies: list[str], tmp_path: Path
) -> None:
    chat = chat_of(tmp_path)
    assert is_local(chat)
    for delta, full in zip(_episode(chat, True, replies), _episode(chat, False, replies), strict=True):
        assert delta == full
    assert [p.merged for p in _episode(chat, True, replies)] == [False, True, True]


def test_a_reply_that_re_renders_differently_is_a_mismatch_and_recorded_ids_win() -> None:
    chat = bundled_chat_template()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    _, last = _turn(chat, messages, None, "sampled", True)
    edited = [*messages, {"role": "assistant", "content": "sampled"}, {"role": "user", "content": "next"}]
    plan = plan_chat(chat, edited, TOOLS, last, 1, local=True)
    assert plan.merged and not plan.mismatch
    other = [*chat.encode("SAMPLED"), chat.eos_id]  # the text the reply's message does not render to
    held = [*last.held[: -len(last.output_ids)], *other]
    plan = plan_chat(chat, edited, TOOLS, replace(last, output_ids=other, held=held), 1,
                     local=True)  # fmt: skip
    assert plan.merged and plan.mismatch and plan.prompt_ids[: len(held)] == held


def test_a_template_that_rewrites_history_is_not_local() -> None:
    bundled = bundled_chat_template()
    chat = ChatTemplate(bundled.tokenizer, compile_template(STRIPS_REASONING), bundled.eos_id, bundled.eos_text,
                        bundled.special)  # fmt: skip
    assert not is_local(chat)


def test_the_stand_in_prompt_is_cached_per_system_message_and_tools() -> None:
    """The stand-in prompt (system message + one user turn) is rendered once per system message and
    tool set; a cache that mixed them up would make the delta fail (None) or count a mismatch."""
    chat = bundled_chat_template()
    reply, new = {"role": "assistant", "content": "ok"}, [{"role": "user", "content": "next"}]
    output = [*chat.encode("ok"), chat.eos_id]
    for system, tools in [("A.", None), ("B.", None), ("A.", TOOLS), ("B.", TOOLS), ("A.", None)]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "task"}]
        delta = extend(chat, messages, reply, new, output, tools)
        assert delta is not None and delta[1], (system, tools)
        held = [*chat.encode(chat.render(messages, True, tools)), *output]
        assert held + delta[0] == chat.encode(chat.render([*messages, reply, *new], True, tools))


def test_mismatches_are_counted_per_route_in_metrics() -> None:
    from prometheus_client import CollectorRegistry

    from services.llm_proxy.gateway.metrics import GatewayMetrics
    from services.llm_proxy.gateway.parsers import ParsedReply
    from services.llm_proxy.gateway.tokens import Plan

    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.observe("responses", Plan([1, 2], 0, True, True), ParsedReply(content="x"), 0.001)
    metrics.observe("chat", Plan([1, 2], 0, True, False), ParsedReply(content="x"), 0.001)
    name = "rollout_gateway_retokenization_mismatches_total"
    assert registry.get_sample_value(name, {"route": "responses"}) == 1.0
    assert registry.get_sample_value(name, {"route": "chat"}) is None

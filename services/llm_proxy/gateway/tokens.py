"""Which prompt ids a call sends, and whether it extends the session's open token sequence.

0. When the pool's template is local (``delta.is_local``) and the messages are the last call's
   messages plus the reply the gateway gave plus new ones, only the new messages are rendered and
   tokenised, and appended to the recorded ids (``delta.extend``); a reply that does not re-render
   as sampled is counted as a mismatch, as in 2.
1. Render the conversation with the pool's chat template and tokenize it. When those ids start
   with the open segment's ids (the last call's prompt + output), the call merges: the extra
   tail is template/tool text (loss mask 0).
2. Otherwise, when the messages are the last call's messages plus the reply the gateway gave plus
   new ones, the recorded ids win (token in): the new messages are rendered as a delta and
   appended to the recorded ids. The call merges, and is counted as a re-render mismatch.
3. Otherwise the agent rewrote its history: the call starts a new segment with the rendered ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.llm_proxy.gateway.delta import extend
from services.runtime.chat import ChatTemplate

Messages = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Context:
    """What the session remembers of its last call (stored as JSON beside the call log)."""

    messages: Messages  # the call's template messages
    reply: dict[str, Any] | None  # the assistant message the gateway answered with (chat routes)
    tools: list[dict[str, Any]] | None
    segment: int
    held: list[int]  # the segment's ids: the last call's prompt + output
    ended_with_eos: bool
    output_ids: list[int] = field(default_factory=list)  # the last call's output (the reply's sampled ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "reply": self.reply,
            "tools": self.tools,
            "segment": self.segment,
            "eos": self.ended_with_eos,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    prompt_ids: list[int]
    segment: int
    merged: bool
    mismatch: bool


def normal(message: dict[str, Any]) -> dict[str, Any]:
    """A message as compared across calls: role, text and tool calls (ids and extras dropped)."""
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    return out


def plan_chat(
    chat: ChatTemplate,
    messages: Messages,
    tools: list[dict[str, Any]] | None,
    last: Context | None,
    next_segment: int,
    *,
    local: bool = False,
) -> Plan:
    if local and last is not None:
        delta = _delta(chat, messages, tools, last)
        if delta is not None:
            ids, exact = delta
            return Plan([*last.held, *ids], last.segment, merged=True, mismatch=not exact)
    full = chat.render(messages, True, tools)
    rendered = chat.encode(full)
    if last is None:
        return Plan(rendered, next_segment, merged=False, mismatch=False)
    if _extends(rendered, last.held):
        return Plan(rendered, last.segment, merged=True, mismatch=False)
    spliced = _token_in(chat, messages, tools, last, full)
    if spliced is not None:
        return Plan(spliced, last.segment, merged=True, mismatch=True)
    return Plan(rendered, next_segment, merged=False, mismatch=False)


def plan_ids(ids: list[int], last: Context | None, next_segment: int) -> Plan:
    """A raw prompt (``/v1/completions``): merged when it extends the open segment."""
    if last is not None and _extends(ids, last.held):
        return Plan(ids, last.segment, merged=True, mismatch=False)
    return Plan(ids, next_segment, merged=False, mismatch=False)


def _extends(ids: Sequence[int], held: Sequence[int]) -> bool:
    return len(ids) > len(held) and ids[: len(held)] == held


def _continues(messages: Messages, tools: list[dict[str, Any]] | None, last: Context) -> bool:
    """The messages are the last call's, then the gateway's reply, then at least one more."""
    if last.reply is None or not last.ended_with_eos or tools != last.tools:
        return False
    before = [*last.messages, last.reply]
    n = len(before)
    if len(messages) <= n:
        return False
    head = messages[:n]
    return head == before or [normal(m) for m in head] == [normal(m) for m in before]  # equal dicts: no normalising


def _delta(
    chat: ChatTemplate, messages: Messages, tools: list[dict[str, Any]] | None, last: Context
) -> tuple[list[int], bool] | None:
    if not _continues(messages, tools, last) or last.reply is None:
        return None
    return extend(chat, last.messages, last.reply, messages[len(last.messages) + 1 :], last.output_ids, tools)


def _token_in(
    chat: ChatTemplate, messages: Messages, tools: list[dict[str, Any]] | None, last: Context, full: str
) -> list[int] | None:
    if not _continues(messages, tools, last):
        return None
    n = len(last.messages) + 1
    base = chat.render(messages[:n], False, tools)
    cut = base.rfind(chat.eos_text)
    if not full.startswith(base) or cut < 0:
        return None
    closing = base[cut + len(chat.eos_text) :]  # what the template puts after the reply's end of turn
    return [*last.held, *chat.encode_after_eos(closing + full[len(base) :])]

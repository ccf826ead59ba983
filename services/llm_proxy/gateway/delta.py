"""Rendering only the new messages of a call that extends the session's conversation.

A prefix-extending agent sends its whole history every call; rendering and tokenising all of it
costs O(history) per call and O(history^2) per episode. For a *local* chat template (one whose
rendering of a message depends on the system message and the tools, not on the rest of the
history) the new messages render the same after a short stand-in history as after the real one:
``render(S + [reply] + new) - render(S + [reply])``, where ``S`` is the system message (if any)
and one user message. Only those texts are rendered and only the delta is tokenised.

Whether a template is local is checked once per template (:func:`is_local`), on conversations
built to catch the usual non-local rules (default system prompts, tool declarations, reasoning
stripped from earlier turns once a new user message arrives). A template that fails is always
rendered whole (``tokens.plan_chat``).

Token-exactness: the call's ids are the recorded ids (the last prompt + output) followed by the
delta's ids, which is what the full render gives when the reply re-renders as it was sampled and
the sampled ids are the tokenizer's own encoding of that text. Both are checked per call, on the
reply alone; when either fails the call still merges (recorded ids win) and is counted as a mismatch.

The delta, and the reply for its check, are tokenised where they stand, after an end-of-turn token
(``services.runtime.chat.encode_after``: some tokenizers mark the start of an input).
"""

from __future__ import annotations

from typing import Any

import orjson

from services.runtime.chat import ChatTemplate

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None

_STAND_IN_USER = {"role": "user", "content": "-"}
ASKED_CACHE = 4096  # stand-in prompts kept per process (one per system message and tool set)
_ASKED: dict[tuple[int, bytes, bytes], tuple[ChatTemplate, str]] = {}  # (id of template, system, tools) -> render
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "p", "parameters": {}}}


def stand_in(messages: Messages) -> Messages:
    """The short history the delta is rendered after: the real system message, then one user turn."""
    head = messages[:1] if messages and messages[0].get("role") in ("system", "developer") else []
    return [*head, _STAND_IN_USER]


def delta_text(
    chat: ChatTemplate, base: Messages, new: Messages, tools: Tools, before: str | None = None
) -> str | None:
    """What ``new`` adds after ``base`` (a finished conversation), generation prompt included;
    ``before``: ``base`` already rendered (without a generation prompt)."""
    before = chat.render(base, False, tools) if before is None else before
    after = chat.render([*base, *new], True, tools)
    return after[len(before) :] if after.startswith(before) else None


def extend(
    chat: ChatTemplate, messages: Messages, reply: dict[str, Any], new: Messages, output_ids: list[int], tools: Tools
) -> tuple[list[int], bool] | None:
    """``(ids to append to the recorded ids, exact)`` or None when the template cannot delta-render them.

    One render when the reply re-renders as sampled (the usual case): the new messages after the
    stand-in history and the reply start with the stand-in prompt and the sampled text, and what
    follows the reply's end of turn is the delta (for a local template ``render(base + reply)`` is a
    prefix of that render, so this is the same text as its closing plus the new messages' own).
    Otherwise the reply is rendered alone too, to find where it ends."""
    base = stand_in(messages)
    asked = _asked(chat, base, tools)
    sampled = chat.decode(output_ids, skip_special=False)
    after = chat.render([*base, reply, *new], True, tools)
    head = asked + sampled
    if sampled.endswith(chat.eos_text) and after.startswith(head):
        return chat.encode_after_eos(after[len(head) :]), chat.encode_after_eos(sampled) == output_ids
    replied = chat.render([*base, reply], False, tools)
    cut = replied.rfind(chat.eos_text)
    if cut < 0 or not after.startswith(replied) or not replied.startswith(asked):
        return None
    closing = replied[cut + len(chat.eos_text) :]  # what the template puts after the reply's end of turn
    exact = replied[: cut + len(chat.eos_text)] == head and chat.encode_after_eos(sampled) == output_ids
    return chat.encode_after_eos(closing + after[len(replied) :]), exact


def _asked(chat: ChatTemplate, base: Messages, tools: Tools) -> str:
    """``render(base, True, tools)``, cached: it depends only on the system message and the tools,
    the same for every call of a session (and of a job)."""
    key = (id(chat), orjson.dumps(base[:-1]), orjson.dumps(tools) if tools else b"")
    found = _ASKED.get(key)
    if found is None or found[0] is not chat:  # the entry holds its template: an id is never reused under it
        if len(_ASKED) >= ASKED_CACHE:
            _ASKED.clear()
        found = _ASKED[key] = (chat, chat.render(base, True, tools))
    return found[1]


def is_local(chat: ChatTemplate) -> bool:
    """Whether delta rendering equals full rendering on the probe conversations, with and without tools."""
    for tools in (None, [_PROBE_TOOL]):
        for conversation in _probes():
            for split in range(2, len(conversation)):
                if conversation[split - 1]["role"] != "assistant":
                    continue
                history, new = conversation[:split], conversation[split:]
                full = chat.render(conversation, True, tools)
                tail = delta_text(chat, stand_in(history) + history[-1:], new, tools)
                if tail is None or full != chat.render(history, False, tools) + tail:
                    return False
    return True


def _probes() -> list[Messages]:
    call = {"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}
    think = "<think>\nweigh it\n</think>\n\nok"
    system = {"role": "system", "content": "Be brief."}
    turns: Messages = [
        {"role": "user", "content": "first task"},
        {"role": "assistant", "content": think},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "calling", "tool_calls": [call]},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": think},
        {"role": "tool", "content": "more"},
        {"role": "user", "content": "third"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "again"},
    ]
    return [[system, *turns], turns]

"""Scripted replies: rule matching and the turn index, without a server."""

from __future__ import annotations

from services.engines.scripted import Script, ScriptedReplies
from services.engines.tokenization import TextCodec, render_chat

SCRIPT = {
    "rules": [
        {"match": "fix the bug", "replies": ["ls", {"text": "cat x.py", "latency_s": 0.5}, "submit"]},
        {"match": "hello", "replies": ["hi there"]},
    ],
    "default": "I do not know.",
    "latency_s": 0.1,
}


def _prompt(*turns: tuple[str, str]) -> str:
    return render_chat([{"role": r, "content": c} for r, c in turns])


def test_reply_index_counts_assistant_turns_and_last_repeats() -> None:
    script = Script.model_validate(SCRIPT)
    assert script.choose(_prompt(("user", "please fix the bug"))).text == "ls"
    two = _prompt(("user", "please fix the bug"), ("assistant", "ls"), ("user", "a.py"))
    assert script.choose(two).text == "cat x.py"
    many = _prompt(*[("user", "fix the bug"), ("assistant", "x")] * 5, ("user", "go"))
    assert script.choose(many).text == "submit"
    assert script.choose(_prompt(("user", "something else"))).text == "I do not know."


def test_scripted_reply_tokens_and_latency() -> None:
    codec = TextCodec.bundled()
    replies = ScriptedReplies(Script.model_validate(SCRIPT), codec)
    two = codec.encode(_prompt(("user", "fix the bug"), ("assistant", "ls"), ("user", "ok")))
    reply = replies.reply(two, 100, ignore_eos=False)
    assert codec.decode(reply.token_ids) == "cat x.py"
    assert reply.latency_s == 0.5 and reply.ends_with_eos
    first = replies.reply(codec.encode(_prompt(("user", "hello"))), 100, ignore_eos=False)
    assert codec.decode(first.token_ids) == "hi there" and first.latency_s == 0.1

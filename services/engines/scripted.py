"""Scripted replies for end-to-end tests of agents: canned answers keyed by a prompt substring.

The file is JSON::

    {"rules": [{"match": "<substring of the decoded prompt>",
                "replies": ["text", {"text": "...", "latency_s": 0.2}, ...]}],
     "default": "text", "latency_s": 0.0}

For a call the prompt ids are decoded and the first rule whose ``match`` occurs is taken. The
reply index is the number of assistant turns already in the prompt (the generation prompt opens
one more, so ``k = prompt.count("<|im_start|>assistant") - 1``); the last reply repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from services.engines.replies import Reply
from services.engines.tokenization import TextCodec

ASSISTANT_OPEN = "<|im_start|>assistant"


class ScriptedReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    latency_s: float | None = Field(None, ge=0)


class ScriptRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    match: str
    replies: list[str | ScriptedReply] = Field(min_length=1)


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[ScriptRule] = []
    default: str = ""
    latency_s: float = Field(0.0, ge=0)

    @classmethod
    def load(cls, path: Path) -> Script:
        return cls.model_validate_json(path.read_text())

    def choose(self, prompt: str) -> ScriptedReply:
        """The reply for a decoded prompt (see the module docstring)."""
        turn = max(0, prompt.count(ASSISTANT_OPEN) - 1)
        for rule in self.rules:
            if rule.match in prompt:
                picked = rule.replies[min(turn, len(rule.replies) - 1)]
                return picked if isinstance(picked, ScriptedReply) else ScriptedReply(text=picked)
        return ScriptedReply(text=self.default)


@dataclass(frozen=True, slots=True)
class ScriptedReplies:
    """A :class:`~services.engines.replies.ReplySource` answering from a :class:`Script`."""

    script: Script
    codec: TextCodec

    def reply(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        ignore_eos: bool,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Reply:
        chosen = self.script.choose(self.codec.decode(prompt_ids))
        latency = self.script.latency_s if chosen.latency_s is None else chosen.latency_s
        return Reply(token_ids=self.codec.encode(chosen.text), ends_with_eos=True, latency_s=latency)

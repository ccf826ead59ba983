"""Token-in-token-out chat tokenization with the model directory's tokenizer and chat template.

The worker never re-tokenizes the history: the first prompt is rendered and tokenized once, and
each later message is rendered as a *delta* against a fixed dummy conversation (the text the
template adds for that message alone), then tokenized by itself and appended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from services.runtime.chat import ChatTemplate, encode_after, encode_ids

_DUMMY = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_DUMMY_REPLY = "\x00A\x00"  # a reply that cannot occur in the template's own text
_BEFORE = [*_DUMMY, {"role": "assistant", "content": "A"}]  # what a delta is rendered after


@dataclass(frozen=True)
class ChatTokenizer:
    tokenizer: Tokenizer
    template: Any  # a compiled jinja2 template
    eos_id: int
    special: dict[str, Any]  # bos_token / eos_token for templates that use them
    after_eos: str  # what the template puts after the assistant's eos (ChatML: "\n")
    after_content: str  # what the template puts after an assistant message's content (eos text included)
    eos_text: str  # the end-of-turn token's text (deltas are encoded behind it: runtime.chat.encode_after)
    _cache: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dir(cls, directory: Path) -> ChatTokenizer:
        chat = ChatTemplate.from_dir(directory)
        template, special, eos_text = chat.template, chat.special, chat.eos_text
        with_reply = _render(template, special, [*_DUMMY, {"role": "assistant", "content": _DUMMY_REPLY}], False)
        after_content = with_reply[with_reply.index(_DUMMY_REPLY) + len(_DUMMY_REPLY) :]
        after_eos = after_content[len(eos_text) :] if after_content.startswith(eos_text) else after_content
        return cls(chat.tokenizer, template, chat.eos_id, special, after_eos, after_content, eos_text)

    def _base(self) -> str:
        """The dummy conversation rendered once (the prefix every delta is cut from)."""
        cached = self._cache.get("base")
        if cached is None:
            cached = self._cache["base"] = self.render(_BEFORE, False)
        return cached

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return _render(self.template, self.special, messages, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return encode_ids(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The first prompt (system + task), with the generation prompt that opens the reply."""
        return self.encode(self.render(messages, True))

    def message_ids(self, message: dict[str, str], *, reply_ended_with_eos: bool) -> list[int]:
        """Tokens that follow the model's last generated token: the end of its turn, ``message``,
        and the generation prompt of the next reply."""
        base = self._base()
        full = self.render([*_BEFORE, message], True)
        if not full.startswith(base):
            raise ValueError("the chat template rewrites earlier messages; cannot tokenize a delta")
        closing = self.after_eos if reply_ended_with_eos else self.after_content
        if reply_ended_with_eos:  # the delta follows the reply's end of turn
            return encode_after(self.tokenizer, self.eos_text, self.eos_id, closing + full[len(base) :])
        return self.encode(closing + full[len(base) :])


def _render(template: Any, special: dict[str, Any], messages: list[dict[str, str]], gen: bool) -> str:
    return str(template.render(messages=messages, add_generation_prompt=gen, **special))

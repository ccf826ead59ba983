"""Text <-> token ids for engines that have a tokenizer directory (the ``tokenizers`` package)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from services.runtime.chat import load_tokenizer, token_text, tokenizer_config
from services.runtime.tokenizer import build_tokenizer


class TextCodec:
    """A Hugging Face fast tokenizer plus its end-of-sequence id."""

    def __init__(self, tokenizer: Tokenizer, eos_token: str) -> None:
        self._tok = tokenizer
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"eos token {eos_token!r} is not in the vocabulary")
        self.eos_token_id: int = eos

    @classmethod
    def from_dir(cls, directory: Path) -> TextCodec:
        """Load ``tokenizer.json`` and the eos token named in ``tokenizer_config.json``."""
        eos = token_text(tokenizer_config(directory, missing_ok=True).get("eos_token")) or "<|im_end|>"
        return cls(load_tokenizer(directory), eos)

    @classmethod
    def bundled(cls) -> TextCodec:
        """The platform's byte-level ChatML tokenizer, built in memory."""
        return cls(build_tokenizer(), "<|im_end|>")

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def decode_visible(self, ids: Sequence[int]) -> str:
        """The text a user sees: special tokens (EOS) dropped."""
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


def render_chat(messages: Sequence[Mapping[str, object]]) -> str:
    """ChatML (Qwen style) with the generation prompt opened, as the bundled chat template renders it."""
    parts = [f"<|im_start|>{m.get('role', 'user')}\n{_content_text(m.get('content'))}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def _content_text(content: object) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)

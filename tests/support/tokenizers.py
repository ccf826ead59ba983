"""Tokenizers with properties the bundled byte-level one lacks."""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from services.runtime.tokenizer import CHAT_TEMPLATE

SPECIALS = ["<|im_start|>", "<|im_end|>"]


def metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style tokenizer that puts a word boundary at the start of its input only
    (``prepend_scheme: first``, as Llama 2 and Mistral tokenizers do), with ChatML's special tokens."""
    vocab = {"<unk>": 0}
    for ch in "▁\n-:.<>|_`" + string.ascii_letters + string.digits:
        vocab.setdefault(ch, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tokenizer


def write_metaspace_dir(directory: Path) -> Path:
    """A model directory with :func:`metaspace_tokenizer` and the bundled ChatML template."""
    directory.mkdir(parents=True, exist_ok=True)
    metaspace_tokenizer().save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory

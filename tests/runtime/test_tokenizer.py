"""The bundled tokenizer directory loads with tokenizers and transformers and round-trips text."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from services.runtime.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE, write_tokenizer_dir

TEXT = "fix the bug in `parse()`:\n\tassert x == 'é' # 修复 🐛"


def test_byte_ids_and_exact_round_trip(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(write_tokenizer_dir(tmp_path) / "tokenizer.json"))
    ids = tok.encode(TEXT).ids
    assert ids == list(TEXT.encode())  # one token per byte, id == byte value
    assert tok.decode(ids) == TEXT
    assert tok.get_vocab_size() == VOCAB_SIZE
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [256, 257, 258]


def test_transformers_loads_it_with_the_chat_template(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(write_tokenizer_dir(tmp_path)))
    text = tok.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": TEXT}],
        tokenize=False,
        add_generation_prompt=True,
    )
    expected = f"<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n{TEXT}<|im_end|>\n"
    assert text == expected + "<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 257 and tok.decode(ids) == text
    assert tok.eos_token_id == 258


def test_encode_ids_gives_the_ids_of_encode(tmp_path: Path) -> None:
    """The offset-free fast path gives exactly ``encode``'s ids, special tokens in the text included."""
    import random

    from services.runtime.chat import encode_ids

    tok = Tokenizer.from_file(str(write_tokenizer_dir(tmp_path) / "tokenizer.json"))
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000), 10])) for _ in range(80))
        text += rng.choice(["", "<|im_end|>\n", "<|im_start|>user\n", TEXT])
        assert encode_ids(tok, text) == tok.encode(text, add_special_tokens=False).ids
    assert encode_ids(tok, "<|im_end|>") == [258]

"""A tiny, self-contained Hugging Face tokenizer directory for tests, demos and stand-in engines.

No hub download is possible on our CI machines, so the platform ships its own: byte-level BPE
with no merges (one token per byte, ids 0..255) plus ChatML special tokens, and a Qwen-style
chat template. ``transformers.AutoTokenizer.from_pretrained(dir)`` and ``tokenizers`` both load
it, and every string round-trips exactly. Real deployments point at the policy's own model
directory instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

# Qwen/ChatML style; ``add_generation_prompt`` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_vocab() -> dict[str, int]:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # order by the byte each printable stand-in represents, so that id == byte value
    table = _bytes_to_unicode()
    assert set(table.values()) == set(alphabet)
    return {table[b]: b for b in range(256)}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab=_byte_vocab(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def write_tokenizer_dir(directory: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 65_536,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return directory

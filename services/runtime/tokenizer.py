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

# Qwen2.5/Hermes style (ChatML); ``add_generation_prompt`` opens the assistant turn. With ``tools``
# the system turn lists them and asks for ``<tool_call>{json}</tool_call>``; assistant tool calls
# are re-rendered from ``tool_calls`` and consecutive ``tool`` messages share one user turn, as in
# Qwen2.5's own template. Without tools every message is ``<|im_start|>role\ncontent<|im_end|>\n``.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": '"
    " + (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
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

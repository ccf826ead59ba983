"""Shared by the trainer tests: one tiny model configuration, a tokenizer directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.runtime.tokenizer import write_tokenizer_dir

# Small enough for a few CPU steps per second, with GQA (4 heads, 2 key/value groups) and rope.
TINY = {"vocab_size": 259, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "num_query_groups": 2,
        "ffn_hidden_size": 64, "max_position_embeddings": 128}  # fmt: skip


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    return write_tokenizer_dir(tmp_path / "tokenizer")

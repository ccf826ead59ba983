"""The HF export loads in transformers and gives the same logits as the Megatron model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import TINY
from trainer_client.export import CHECKSUM_FILE, directory_checksum, export_hf
from trainer_client.model import ModelConfig, ParallelConfig, build_gpt, init_parallel, logits

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.parametrize("tied", [False, True])
def test_export_matches_transformers_logits(tmp_path: Path, tokenizer_dir: Path, tied: bool) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = ModelConfig(**TINY, tie_embeddings=tied, seed=3)
    init_parallel(ParallelConfig(), cfg.seed)
    model = build_gpt(cfg, ParallelConfig())
    with torch.no_grad():  # move weights off their init so a swapped tensor cannot hide
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export = export_hf(model.state_dict(), cfg, "7", tmp_path / "exports", tokenizer_dir)

    assert export.path.name == "v7"
    assert json.loads((export.path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (export.path / CHECKSUM_FILE).read_text().strip() == export.checksum == directory_checksum(export.path)
    tokenizer = AutoTokenizer.from_pretrained(export.path)
    ids = torch.tensor([[*tokenizer.encode("hello, megatron!"), tokenizer.eos_token_id]])
    hf = AutoModelForCausalLM.from_pretrained(export.path, dtype=torch.float32)
    hf.eval()  # type: ignore[no-untyped-call]
    assert hf.config.tie_word_embeddings == tied
    with torch.no_grad():
        expected = logits(model.eval(), ids)
        got = hf(ids).logits
    assert expected.abs().max() > 0.1  # a meaningful scale
    assert (got - expected).abs().max().item() < 1e-4


def test_checksum_changes_with_content(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    first = directory_checksum(tmp_path)
    (tmp_path / "a").write_bytes(b"2")
    assert directory_checksum(tmp_path) != first

"""The HF export loads in transformers and gives the same logits as the Megatron model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.protocol.weights import CHECKSUM_FILE
from services.runtime.net import free_port
from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.conftest import TINY
from tests.trainer.launch import wait_all
from trainer_client.export import directory_checksum, export_hf
from trainer_client.hf_map import ARCHITECTURES
from trainer_client.model import Family, ModelConfig, ParallelConfig, build_gpt, init_parallel, logits

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


FAMILIES = [  # (family, tied, head dimension): Qwen3 with a head_dim that is not hidden / heads
    ("llama", False, None), ("llama", True, None), ("qwen2", True, None), ("qwen2", False, None), ("qwen3", False, 16),
]  # fmt: skip


@pytest.mark.parametrize(("family", "tied", "head_dim"), FAMILIES)
def test_export_matches_transformers_logits(
    tmp_path: Path, tokenizer_dir: Path, family: Family, tied: bool, head_dim: int | None
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = ModelConfig(**TINY, family=family, tie_embeddings=tied, kv_channels=head_dim, seed=3)
    init_parallel(ParallelConfig(), cfg.seed)
    model = build_gpt(cfg, ParallelConfig())
    with torch.no_grad():  # move weights off their init so a swapped tensor cannot hide
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export = export_hf(model.state_dict(), cfg, "7", tmp_path / "exports", tokenizer_dir)

    assert export.path.name == "v7"
    assert json.loads((export.path / "config.json").read_text())["architectures"] == [ARCHITECTURES[family]]
    assert (export.path / CHECKSUM_FILE).read_text().strip() == export.checksum == directory_checksum(export.path)
    tokenizer = AutoTokenizer.from_pretrained(export.path)
    ids = torch.tensor([[*tokenizer.encode("hello, megatron!"), tokenizer.eos_token_id]])
    hf = AutoModelForCausalLM.from_pretrained(export.path, dtype=torch.float32)
    hf.eval()  # type: ignore[no-untyped-call]
    assert hf.config.tie_word_embeddings == tied and type(hf).__name__ == ARCHITECTURES[family]
    with torch.no_grad():
        expected = logits(model.eval(), ids)
        got = hf(ids).logits
    assert expected.abs().max() > 0.1  # a meaningful scale
    assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize(("family", "tied", "head_dim"), FAMILIES[1:])
def test_hf_import_round_trip(tmp_path: Path, family: Family, tied: bool, head_dim: int | None) -> None:
    """Export, read the config back, load into a differently seeded model: same logits."""
    from trainer_client.hf_import import load_hf_weights, model_config_from_hf

    cfg = ModelConfig(**TINY, family=family, tie_embeddings=tied, kv_channels=head_dim, seed=21)
    init_parallel(ParallelConfig(), cfg.seed)
    source = build_gpt(cfg, ParallelConfig())
    with torch.no_grad():  # norms and biases off their init (ones, zeros) so that a swap shows
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export = export_hf(source.state_dict(), cfg, "0", tmp_path / "exports", None)
    imported_cfg = model_config_from_hf(export.path, seed=99)
    assert imported_cfg.model_dump(exclude={"seed"}) == cfg.model_dump(exclude={"seed"})
    target = build_gpt(imported_cfg, ParallelConfig())
    ids = torch.tensor([[1, 2, 3, 250, 7]])
    with torch.no_grad():
        assert (logits(target.eval(), ids) - logits(source.eval(), ids)).abs().max() > 1e-3
        load_hf_weights(target, export.path, imported_cfg)
        assert torch.equal(logits(target, ids), logits(source, ids))


def test_checksum_changes_with_content(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    first = directory_checksum(tmp_path)
    (tmp_path / "a").write_bytes(b"2")
    assert directory_checksum(tmp_path) != first


@pytest.mark.timeout(120)
def test_tensor_parallel_export_matches_transformers(tmp_path: Path, tokenizer_dir: Path) -> None:
    """Two real ranks (TP=2 over gloo) gather their shards; the export equals the TP model's logits
    (Llama, Qwen2 with its sharded q/k/v biases, Qwen3 with its replicated q/k norms)."""
    from transformers import AutoModelForCausalLM

    port = free_port()
    procs = []
    log = tmp_path / "ranks.log"
    with log.open("wb") as out:
        for rank in (0, 1):
            env = python_env({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
            argv = [sys.executable, "-m", "tests.trainer.tp_worker", str(tmp_path), str(tokenizer_dir)]
            procs.append(subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT))
    codes = wait_all(procs, 100)
    assert codes == [0, 0], log.read_text()[-3000:]
    for family in ("llama", "qwen2", "qwen3"):
        run = tmp_path / family
        meta = json.loads((run / "export.json").read_text())
        hf = AutoModelForCausalLM.from_pretrained(meta["path"], dtype=torch.float32)
        assert type(hf).__name__ == ARCHITECTURES[family]
        with torch.no_grad():
            got = hf(torch.tensor(meta["ids"])).logits
        expected = torch.load(run / "megatron_logits.pt")
        assert got.shape == expected.shape == (1, len(meta["ids"][0]), 260)
        assert (got - expected).abs().max().item() < 1e-4, family
        # and back: a fresh TP=2 model loading the export slices it per rank into the same function
        assert torch.equal(torch.load(run / "reloaded_logits.pt"), expected), family


def test_tokenizer_dir_that_is_a_model_dir_does_not_overwrite_the_weights(tmp_path: Path, tokenizer_dir: Path) -> None:
    """The tokenizer often comes from the model directory the run started from: its weights and
    config must not be copied over the export's own (seen in `rollout up`: every export was v0)."""
    source = tmp_path / "model-v0"
    source.mkdir()
    for file in tokenizer_dir.iterdir():
        (source / file.name).write_bytes(file.read_bytes())
    (source / "model.safetensors").write_bytes(b"stale weights")
    (source / "config.json").write_text("{}")
    cfg = ModelConfig(vocab_size=4, hidden_size=8, num_layers=1, num_attention_heads=2, num_query_groups=1)
    state = {
        "embedding.word_embeddings.weight": torch.ones(4, 8),
        "decoder.final_layernorm.weight": torch.ones(8),
        "output_layer.weight": torch.ones(4, 8),
        **_layer_state(cfg),
    }
    export = export_hf(state, cfg, "1", tmp_path / "exports", source)
    assert (export.path / "model.safetensors").read_bytes() != b"stale weights"
    assert json.loads((export.path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (export.path / "tokenizer.json").exists()


def _layer_state(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_query_groups) * cfg.head_dim
    p = "decoder.layers.0."
    return {
        p + "self_attention.linear_qkv.weight": torch.ones(qkv_rows, h),
        p + "self_attention.linear_proj.weight": torch.ones(h, h),
        p + "mlp.linear_fc1.weight": torch.ones(2 * f, h),
        p + "mlp.linear_fc2.weight": torch.ones(h, f),
        p + "input_layernorm.weight": torch.ones(h),
        p + "pre_mlp_layernorm.weight": torch.ones(h),
    }

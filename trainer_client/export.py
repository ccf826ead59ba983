"""Hugging Face export of the Megatron policy: Llama/Qwen naming, safetensors, config, tokenizer, checksum.

Layout of one export (``<root>/v<version>/``)::

    model.safetensors   weights in the family's naming (:mod:`trainer_client.hf_map`, float32)
    config.json         the family's config fields plus "architectures" (SGLang needs it)
    tokenizer files     copied from the trainer's tokenizer directory
    CHECKSUM            "sha256:<hex>" (also returned and posted in the WeightUpdate)

The checksum is sha256 over the other files in name order, each as ``name \\0 bytes \\0``; an
export is written under a temporary name and renamed when complete. The state given is whole
(tensor-parallel shards gathered first by :func:`trainer_client.shards.full_state_dict`).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from services.protocol.weights import CHECKSUM_FILE, tree_checksum
from trainer_client import hf_map
from trainer_client.model import ModelConfig


@dataclass(frozen=True)
class Export:
    version: str
    path: Path
    checksum: str  # "sha256:<hex>"
    seconds: float


def hf_state_dict(megatron_state: dict[str, Any], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Megatron GPTModel tensors (full, unsharded) in the HF naming of ``cfg.family``."""
    sd = {k: v for k, v in megatron_state.items() if isinstance(v, torch.Tensor) and "_extra_state" not in k}
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in hf_map.to_hf(sd, cfg).items()}


def hf_config(cfg: ModelConfig, eos_token_id: int | None = None) -> dict[str, Any]:
    """``config.json`` of the family (with "architectures": SGLang needs it)."""
    return {
        "architectures": [hf_map.ARCHITECTURES[cfg.family]],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_query_groups,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.norm_epsilon,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "hidden_act": "silu",
        "attention_bias": cfg.family == "qwen2",
        "mlp_bias": False,
        "use_sliding_window": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "eos_token_id": eos_token_id,
    }


def directory_checksum(path: Path) -> str:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
    return tree_checksum((file.name, [file.read_bytes()]) for file in files)


def export_hf(
    megatron_state: dict[str, Any],
    cfg: ModelConfig,
    version: str,
    root: Path,
    tokenizer_dir: Path | None,
    keep: int = 3,
) -> Export:
    """Write ``<root>/v<version>`` and return where it is and its checksum."""
    start = time.perf_counter()
    final, tmp = root / f"v{version}", root / f"v{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(hf_state_dict(megatron_state, cfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    eos = _copy_tokenizer(tokenizer_dir, tmp) if tokenizer_dir else None
    (tmp / "config.json").write_text(json.dumps(hf_config(cfg, eos), indent=2))
    checksum = directory_checksum(tmp)
    (tmp / CHECKSUM_FILE).write_text(checksum + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _prune(root, keep)
    return Export(version=version, path=final, checksum=checksum, seconds=time.perf_counter() - start)


def is_tokenizer_file(name: str) -> bool:
    """Tokenizer files only: a model directory also holds weights and a config that must not be copied
    over the export's own."""
    return name.startswith(("tokenizer", "vocab.", "chat_template")) or name in (
        "special_tokens_map.json", "added_tokens.json", "merges.txt",
    ) or name.endswith(".model")  # fmt: skip


def _copy_tokenizer(source: Path, target: Path) -> int | None:
    """Copy the tokenizer files; return the eos token id if the tokenizer names one."""
    for file in source.iterdir():
        if file.is_file() and is_tokenizer_file(file.name):
            shutil.copy2(file, target / file.name)
    return _eos_id(target)


def _eos_id(directory: Path) -> int | None:
    config, tokenizer = directory / "tokenizer_config.json", directory / "tokenizer.json"
    if not (config.exists() and tokenizer.exists()):
        return None
    eos = json.loads(config.read_text()).get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    for token in json.loads(tokenizer.read_text()).get("added_tokens", []):
        if token.get("content") == eos:
            return int(token["id"])
    return None


def _prune(root: Path, keep: int) -> None:
    exports = sorted((p for p in root.glob("v*") if not p.name.endswith(".tmp")), key=lambda p: p.stat().st_mtime)
    for old in exports[:-keep]:
        shutil.rmtree(old, ignore_errors=True)

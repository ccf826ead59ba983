"""Start the policy from Hugging Face Llama / Qwen2 / Qwen3 weights (the inverse of :mod:`trainer_client.export`).

A training run normally starts from the weights the engines already serve: the directory holds
``config.json`` and ``*.safetensors`` (names from :mod:`trainer_client.hf_map`). With tensor parallelism each
rank keeps its own slice (the inverse of :func:`trainer_client.shards.full_state_dict`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from trainer_client import hf_map
from trainer_client.model import ModelConfig

FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # HF model_type -> ModelConfig.family


def model_config_from_hf(path: Path, **overrides: Any) -> ModelConfig:
    """A :class:`ModelConfig` matching a Llama / Qwen2 / Qwen3 ``config.json``."""
    hf = json.loads((path / "config.json").read_text())
    family = FAMILIES.get(hf.get("model_type", "llama"))
    if family is None:
        raise ValueError(f"unsupported model_type {hf.get('model_type')!r} (supported: {sorted(FAMILIES)})")
    rope = hf.get("rope_parameters") or {}
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return ModelConfig(
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads", heads),
        kv_channels=None if head_dim == hf["hidden_size"] // heads else head_dim,
        ffn_hidden_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10_000.0)),
        norm_epsilon=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        **overrides,
    )


def load_hf_weights(module: Any, path: Path, cfg: ModelConfig) -> None:
    """Copy the directory's safetensors into ``module`` (this rank's tensor-parallel slice)."""
    from megatron.core import parallel_state

    hf: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        hf.update(load_file(str(file)))
    full = hf_map.from_hf(hf, cfg)
    size, rank = 1, 0
    if parallel_state.model_parallel_is_initialized():
        size = parallel_state.get_tensor_model_parallel_world_size()
        rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, param in module.state_dict().items():
            if name in full:
                param.copy_(hf_map.shard(name, full[name], size, rank))

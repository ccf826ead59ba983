"""Start the policy from Hugging Face Llama weights (the inverse of :mod:`trainer_client.export`).

A training run normally starts from the weights the engines already serve: the directory holds
``config.json`` and ``*.safetensors`` in LlamaForCausalLM naming. With tensor parallelism each
rank keeps its own slice (the inverse of :func:`trainer_client.shards.full_state_dict`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from trainer_client.model import ModelConfig
from trainer_client.shards import DIM0, DIM1, GLU


def model_config_from_hf(path: Path, **overrides: Any) -> ModelConfig:
    """A :class:`ModelConfig` matching a Llama ``config.json``."""
    hf = json.loads((path / "config.json").read_text())
    rope = hf.get("rope_parameters") or {}
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        num_query_groups=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        ffn_hidden_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10_000.0)),
        norm_epsilon=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        **overrides,
    )


def megatron_state_from_hf(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full (unsharded) Megatron GPTModel tensors from LlamaForCausalLM tensors."""
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    if not cfg.tie_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    groups, per_group, head_dim = cfg.num_query_groups, cfg.num_attention_heads // cfg.num_query_groups, cfg.head_dim
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[src + "self_attn.q_proj.weight"].view(groups, per_group, head_dim, cfg.hidden_size)
        k = hf[src + "self_attn.k_proj.weight"].view(groups, 1, head_dim, cfg.hidden_size)
        v = hf[src + "self_attn.v_proj.weight"].view(groups, 1, head_dim, cfg.hidden_size)
        out[dst + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, cfg.hidden_size)
        out[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]]
        )
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
    return out


def load_hf_weights(module: Any, path: Path, cfg: ModelConfig) -> None:
    """Copy the directory's safetensors into ``module`` (this rank's tensor-parallel slice)."""
    from megatron.core import parallel_state

    hf: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        hf.update(load_file(str(file)))
    full = megatron_state_from_hf(hf, cfg)
    size, rank = 1, 0
    if parallel_state.model_parallel_is_initialized():
        size = parallel_state.get_tensor_model_parallel_world_size()
        rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, param in module.state_dict().items():
            if name in full:
                param.copy_(_slice(name, full[name], size, rank))


def _slice(name: str, tensor: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    if size == 1:
        return tensor
    if name.endswith(DIM0):
        return tensor.chunk(size, dim=0)[rank]
    if name.endswith(DIM1):
        return tensor.chunk(size, dim=1)[rank]
    if name.endswith(GLU):
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    return tensor

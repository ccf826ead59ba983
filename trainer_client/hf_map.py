"""The one Megatron <-> Hugging Face table: names, layouts and tensor-parallel sharding per tensor.

Export (:mod:`trainer_client.export`), import (:mod:`trainer_client.hf_import`) and the
tensor-parallel gather/slice (:mod:`trainer_client.shards`) all read :data:`GLOBAL` and
:data:`LAYER`; nothing else spells a tensor name. Families (``ModelConfig.family``):

- ``llama``: ``LlamaForCausalLM``; no biases.
- ``qwen2``: ``Qwen2ForCausalLM``; biases on q/k/v (Megatron ``linear_qkv.bias``).
- ``qwen3``: ``Qwen3ForCausalLM``; no biases, RMSNorm on each query and key head
  (Megatron ``q_layernorm`` / ``k_layernorm``), an explicit ``head_dim``.

Layouts (``Layout``): ``COPY`` 1:1; ``QKV`` Megatron's fused ``linear_qkv`` holds, per query
group, ``q_per_group`` query heads then one key and one value head; ``GLU`` Megatron's
``linear_fc1`` is ``[gate; up]``.

Tensor-parallel split (``Split``), local spec: vocab-parallel embedding/output and
column-parallel ``linear_qkv`` (weight and bias) on dim 0 (whole query groups per rank, so
concatenation keeps the group layout); column-parallel ``linear_fc1`` holds ``[gate_r; up_r]``
per rank; row-parallel ``linear_proj``/``linear_fc2`` on dim 1; norms replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer_client.model import ModelConfig


class Layout(Enum):
    COPY = "copy"
    QKV = "qkv"
    GLU = "glu"


class Split(Enum):
    REPLICATED = "replicated"
    DIM0 = "dim0"
    DIM1 = "dim1"
    GLU = "glu"


@dataclass(frozen=True)
class Param:
    megatron: str  # name in GPTModel.state_dict() (relative to ``decoder.layers.{i}.`` for layer tensors)
    hf: tuple[str, ...]  # HF name(s) (relative to ``model.layers.{i}.`` for layer tensors)
    layout: Layout = Layout.COPY
    split: Split = Split.REPLICATED
    when: Callable[[ModelConfig], bool] = lambda cfg: True  # present in this configuration


def _untied(cfg: ModelConfig) -> bool:
    return not cfg.tie_embeddings


def _qkv_bias(cfg: ModelConfig) -> bool:
    return cfg.family == "qwen2"


def _qk_norm(cfg: ModelConfig) -> bool:
    return cfg.family == "qwen3"


QKV_HF = ("self_attn.q_proj.{}", "self_attn.k_proj.{}", "self_attn.v_proj.{}")

GLOBAL = (
    Param("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), split=Split.DIM0),
    Param("decoder.final_layernorm.weight", ("model.norm.weight",)),
    Param("output_layer.weight", ("lm_head.weight",), split=Split.DIM0, when=_untied),
)
LAYER = (
    Param("self_attention.linear_qkv.weight", tuple(n.format("weight") for n in QKV_HF), Layout.QKV, Split.DIM0),
    Param(
        "self_attention.linear_qkv.bias",
        tuple(n.format("bias") for n in QKV_HF),
        Layout.QKV,
        Split.DIM0,
        when=_qkv_bias,
    ),  # fmt: skip
    Param("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), when=_qk_norm),
    Param("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), when=_qk_norm),
    Param("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), split=Split.DIM1),
    Param("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), Layout.GLU, Split.GLU),
    Param("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), split=Split.DIM1),
    Param("input_layernorm.weight", ("input_layernorm.weight",)),
    Param("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",)),
)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def entries(cfg: ModelConfig) -> list[tuple[str, tuple[str, ...], Param]]:
    """(Megatron name, HF names, rule) for every tensor of this configuration."""
    out = [(p.megatron, p.hf, p) for p in GLOBAL if p.when(cfg)]
    for i in range(cfg.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out += [(src + p.megatron, tuple(dst + h for h in p.hf), p) for p in LAYER if p.when(cfg)]
    return out


def split_of(name: str) -> Split:
    """How a Megatron tensor is sharded over tensor-parallel ranks (by its name)."""
    for p in (*GLOBAL, *LAYER):
        if name.endswith(p.megatron):
            return p.split
    return Split.REPLICATED


def to_hf(megatron: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full (unsharded) Megatron GPTModel tensors -> HF tensors."""
    out: dict[str, torch.Tensor] = {}
    for name, hf_names, rule in entries(cfg):
        out.update(zip(hf_names, _unfuse(rule.layout, megatron[name], cfg), strict=True))
    return out


def from_hf(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF tensors -> full (unsharded) Megatron GPTModel tensors."""
    return {name: _fuse(rule.layout, [hf[h] for h in hf_names], cfg) for name, hf_names, rule in entries(cfg)}


def _unfuse(layout: Layout, tensor: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
    if layout is Layout.GLU:
        return list(tensor.chunk(2, dim=0))
    if layout is Layout.QKV:
        groups, per_group = cfg.num_query_groups, cfg.num_attention_heads // cfg.num_query_groups
        rest = tensor.shape[1:]
        qkv = tensor.view(groups, per_group + 2, cfg.head_dim, *rest)
        parts = (qkv[:, :per_group], qkv[:, per_group], qkv[:, per_group + 1])
        return [p.reshape(-1, *rest) for p in parts]
    return [tensor]


def _fuse(layout: Layout, tensors: list[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    if layout is Layout.GLU:
        return torch.cat(tensors)
    if layout is Layout.QKV:
        groups, per_group = cfg.num_query_groups, cfg.num_attention_heads // cfg.num_query_groups
        q, k, v = tensors
        rest = q.shape[1:]
        shaped = [q.view(groups, per_group, cfg.head_dim, *rest)] + [
            t.view(groups, 1, cfg.head_dim, *rest) for t in (k, v)
        ]
        return torch.cat(shaped, dim=1).reshape(-1, *rest)
    return tensors[0]


def shard(name: str, tensor: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    """This tensor-parallel rank's slice of a full tensor."""
    split = split_of(name)
    if size == 1 or split is Split.REPLICATED:
        return tensor
    if split is Split.GLU:
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    return tensor.chunk(size, dim=0 if split is Split.DIM0 else 1)[rank]


def unshard(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every tensor-parallel rank's slice (in rank order)."""
    split = split_of(name)
    if split is Split.REPLICATED:
        return parts[0]
    if split is Split.GLU:
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(parts, dim=0 if split is Split.DIM0 else 1)

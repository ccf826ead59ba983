"""Whole tensors from tensor-parallel shards, for the Hugging Face export.

Every tensor-parallel rank calls :func:`full_state_dict` (it is a collective); each gets the
unsharded state dict. How Megatron shards each GPTModel tensor (local spec):

- vocab-parallel (embedding, output layer) and column-parallel ``linear_qkv``: split on dim 0.
  ``linear_qkv`` holds whole query groups per rank, so concatenating keeps the group layout.
- column-parallel ``linear_fc1`` with SwiGLU: each rank holds ``[gate_r; up_r]``, so the gates
  and the ups are concatenated separately.
- row-parallel ``linear_proj`` and ``linear_fc2``: split on dim 1.
- norms: replicated.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

DIM0 = ("embedding.word_embeddings.weight", "output_layer.weight", "self_attention.linear_qkv.weight")
DIM1 = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
GLU = "mlp.linear_fc1.weight"


def tensors(module: Any) -> dict[str, torch.Tensor]:
    """The module's tensors, without Megatron's ``_extra_state`` entries."""
    return {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor) and "_extra_state" not in k}


def full_state_dict(module: Any) -> dict[str, torch.Tensor]:
    """The unsharded state dict (collective over the tensor-parallel group)."""
    from megatron.core import parallel_state

    local = tensors(module)
    size = (
        parallel_state.get_tensor_model_parallel_world_size() if parallel_state.model_parallel_is_initialized() else 1
    )
    if size == 1:
        return local
    group = parallel_state.get_tensor_model_parallel_group()
    return {name: _merge(name, _all_gather(t, size, group)) for name, t in local.items()}


def _all_gather(tensor: torch.Tensor, size: int, group: Any) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def _merge(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if name.endswith(DIM0):
        return torch.cat(parts, dim=0)
    if name.endswith(DIM1):
        return torch.cat(parts, dim=1)
    if name.endswith(GLU):
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return parts[0]  # replicated

"""Whole tensors from tensor-parallel shards, for the Hugging Face export.

Every tensor-parallel rank calls :func:`full_state_dict` (it is a collective); each gets the
unsharded state dict. How each tensor is split is in the one table, :mod:`trainer_client.hf_map`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from trainer_client import hf_map


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
    return {name: hf_map.unshard(name, _all_gather(t, size, group)) for name, t in local.items()}


def _all_gather(tensor: torch.Tensor, size: int, group: Any) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts

"""CPU compatibility shims for megatron-core (0.16.1) on hosts without a GPU.

megatron-core assumes CUDA in a handful of places even when every tensor lives on the CPU.
These shims make it run on CPU-only hosts (tests, laptops, this project's CI) and are applied
only when ``torch.cuda.is_available()`` is False; on GPU hosts nothing here is touched.

What each shim covers:

- ``torch.cuda.current_device`` -> ``"cpu"``: the DDP grad buffers (and Megatron's local
  ``DotProductAttention`` buffers, unused here) allocate on the current device.
- ``torch.cuda.synchronize`` -> no-op: ``dist_checkpointing`` preloads tensors with it.
- ``CudaRNGStatesTracker.fork`` -> ``nullcontext``: the attention-dropout RNG fork swaps CUDA
  RNG states.
- ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` -> the CPU generator's
  state / no-op: activation recomputation (``CheckpointFunction``) saves and restores the CUDA RNG.
- :class:`CudaToCpu`, a ``TorchFunctionMode`` entered only around Megatron optimizer and
  checkpoint calls (:func:`megatron_on_cpu`): Megatron's optimizer and ``clip_grads`` pass
  ``device="cuda"``, call ``.cuda()`` and assert ``grad.type() == "torch.cuda.FloatTensor"``;
  the mode sends the first two to the CPU and answers the third with the CUDA type name.

Not a shim: the core attention is :class:`trainer_client.attention.SegmentAttention` (SDPA), which
needs no mask for causal attention, whereas Megatron's local attention builds its default mask on CUDA.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)

_state: dict[str, bool] = {"applied": False}


class CudaToCpu(TorchFunctionMode):
    """Redirect ``device="cuda"`` and ``.cuda()`` to the CPU; report CPU float tensors as CUDA ones."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kw = dict(kwargs or {})
        device = kw.get("device")
        if device is not None and "cuda" in str(device):
            kw["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kw:
            return str(func(*args)).replace("torch.", "torch.cuda.", 1)
        return func(*args, **kw)


def shims_needed() -> bool:
    """True on hosts without a usable GPU."""
    return not torch.cuda.is_available()


def shims_applied() -> bool:
    return _state["applied"]


def apply_cpu_shims() -> bool:
    """Patch the CUDA entry points once if no GPU is present. Returns whether they are active."""
    if not shims_needed():
        return False
    if shims_applied():
        return True
    from megatron.core.tensor_parallel import random as megatron_random

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *a, **k: None
    megatron_random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    megatron_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda *a, **k: None
    _state["applied"] = True
    logger.info("no GPU: megatron-core CPU shims applied")
    return True


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Run a block of Megatron optimizer / checkpoint code under :class:`CudaToCpu` when no GPU is present.

    Scoped rather than global, so that other torch code in the same process never sees CUDA
    type names for CPU tensors. On GPU hosts this does nothing.
    """
    if not apply_cpu_shims():
        yield
        return
    with CudaToCpu():
        yield

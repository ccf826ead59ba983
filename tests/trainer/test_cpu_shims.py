"""The CPU shims: applied only without a GPU; each redirects what megatron-core hard-codes to CUDA."""

from __future__ import annotations

import pytest
import torch

from trainer_client import cpu_shims

pytestmark = [pytest.mark.trainer]


def test_not_applied_when_a_gpu_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_shims.apply_cpu_shims() is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_shims_on_cpu() -> None:
    assert cpu_shims.apply_cpu_shims() is True
    assert cpu_shims.apply_cpu_shims() is True  # idempotent
    assert str(torch.cuda.current_device()) == "cpu"
    torch.cuda.synchronize()
    with cpu_shims.megatron_on_cpu():
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu"
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"  # megatron's clip_grads asserts this
        assert torch.ones(2).type(torch.float64).dtype == torch.float64  # a conversion is left alone
    assert torch.ones(2).type() == "torch.FloatTensor"  # scoped: nothing leaks outside the block
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    with CudaRNGStatesTracker().fork():  # no CUDA RNG state to swap
        pass

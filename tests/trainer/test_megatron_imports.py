"""trainer_client keeps megatron-core's optional wandb import from running, and only megatron's (any other
module imports wandb as usual); on a host without a GPU, megatron's ``jit_fuser`` is its no-op, so
neither TorchDynamo nor Inductor is imported. About 3 s of CPU per process that builds a model."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT, python_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None or importlib.util.find_spec("megatron.core") is None,
    reason="needs wandb and megatron-core installed",
)

CHECK = """
import sys
import trainer_client
import megatron.core.timers as timers
from megatron.core.inference.contexts import dynamic_context
print("after megatron:", "wandb" in sys.modules, timers.wandb, dynamic_context.HAVE_WANDB)
import torch
from megatron.core import jit
from megatron.core.fusions import fused_bias_dropout
print("gpu:", torch.cuda.is_available(), "fuser:", jit.jit_fuser.__name__, "dynamo:", "torch._dynamo" in sys.modules)
print("fused:", type(fused_bias_dropout.bias_dropout_add_fused_train).__name__)
import wandb
print("a user's import:", wandb.__name__, callable(wandb.init))
"""


def test_megatron_does_not_import_wandb_but_a_user_still_can() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO_ROOT, env=python_env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    assert "after megatron: False None False" in out, out
    assert "a user's import: wandb True" in out, out
    if "gpu: False" in out:  # the fused kernels are plain functions; no compiler stack was imported
        assert "fuser: noop_decorator dynamo: False" in out, out
        assert "fused: function" in out, out
    else:
        assert "fuser: compile" in out, out

"""The training job's side: trajectories in, GRPO with Megatron-core, weights out.

Two imports megatron-core makes that this trainer never uses cost about 3 s of CPU together, at every
rank's start and in every process of the test suite that builds a model, so this package's import
(which comes before megatron's: megatron is imported inside trainer_client's functions) turns them off:

- wandb: megatron imports it wherever it is installed (``try: import wandb`` in its timers and inference
  contexts, for writers this trainer never hands it), and Atropos' environment package installs it
  beside the trainer. For megatron's own modules ``import wandb`` answers as where wandb is not
  installed; any other module, a user's training script included, imports it as usual.
- torch.compile: megatron's ``jit_fuser`` decorates its fused kernels (bias-GELU, bias-dropout-add, ...)
  with ``torch.compile``, which imports TorchDynamo and Inductor at once. On a host without a GPU none
  of those kernels runs (the CPU path keeps every fusion off: no compiled frame is ever run), so
  there ``jit_fuser`` is megatron's own no-op decorator. With a GPU nothing changes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import Loader
from importlib.machinery import ModuleSpec, PathFinder
from types import FrameType, ModuleType

_IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib",
                     "_frozen_importlib_external", __name__)  # fmt: skip


def _importer(frame: FrameType | None) -> str:
    """The module whose ``import`` statement is being run, past the import machinery's frames."""
    while frame is not None and frame.f_globals.get("__name__") in _IMPORT_MACHINERY:
        frame = frame.f_back
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


class _JitWithoutCompile(Loader):
    """megatron.core.jit's own loader, then ``jit_fuser`` set to its no-op where no GPU is present."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        import torch

        if not torch.cuda.is_available():
            setattr(module, "jit_fuser", module.noop_decorator)  # noqa: B010 (a module type-checkers do not see)


class MegatronImports:
    """A meta path finder: ``wandb`` imported by a ``megatron.*`` module is not found
    (ModuleNotFoundError, which megatron takes for wandb not being installed); ``megatron.core.jit``
    gets the loader above; every other import is left to the finders after it."""

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "wandb" and _importer(sys._getframe(1)).startswith("megatron."):
            raise ModuleNotFoundError("wandb is not offered to megatron-core here (trainer_client)", name=name)
        if name == "megatron.core.jit":
            spec = PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _JitWithoutCompile(spec.loader)
            return spec
        return None


if not any(isinstance(finder, MegatronImports) for finder in sys.meta_path):
    sys.meta_path.insert(0, MegatronImports())

"""The training job's side: trajectories in, GRPO with Megatron-core, weights out.

megatron-core imports wandb wherever it is installed (``try: import wandb`` in its timers and inference
contexts, for writers this trainer never hands it), and wandb's import is about 2 s of CPU: at every
rank's start, and in every process of the test suite that builds a model. Atropos' environment package
installs wandb beside the trainer. So for megatron's own modules, ``import wandb`` answers as where
wandb is not installed; any other module, a user's training script included, imports it as usual.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from types import FrameType

_IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib",
                     "_frozen_importlib_external", __name__)  # fmt: skip


def _importer(frame: FrameType | None) -> str:
    """The module whose ``import`` statement is being run, past the import machinery's frames."""
    while frame is not None and frame.f_globals.get("__name__") in _IMPORT_MACHINERY:
        frame = frame.f_back
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


class WandbHiddenFromMegatron:
    """A meta path finder that finds nothing; for ``wandb`` imported by a ``megatron.*`` module it
    answers ModuleNotFoundError, which megatron takes for wandb not being installed."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name == "wandb" and _importer(sys._getframe(1)).startswith("megatron."):
            raise ModuleNotFoundError("wandb is not offered to megatron-core here (trainer_client)", name=name)
        return None


if not any(isinstance(finder, WandbHiddenFromMegatron) for finder in sys.meta_path):
    sys.meta_path.insert(0, WandbHiddenFromMegatron())

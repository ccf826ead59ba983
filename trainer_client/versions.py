"""Weight versions that identify one set of weights for ever.

The label format is the contract's (``services.protocol.weights.version_label``): ``"0"`` for the
initial weights (the same at every start: ``INIT_FROM`` or the seeded init) and
``"<step>-e<epoch>"`` for the weights after optimizer step ``step`` trained by run epoch ``epoch``.
The epoch changes at every start of the trainer: it is taken from a counter file in the checkpoint
directory (``EPOCH``), incremented and fsynced before anything is trained or posted. A trainer
killed after posting ``"5-e3"`` but before the checkpoint that kept those weights restarts as epoch
4 and posts ``"5-e4"``: the label of the lost weights is never reused for different weights.

The *lineage* (kept in every checkpoint) says which labels name ancestors of the current
weights: for each epoch, the steps whose weights the run still builds on. Staleness is computed
on it (current step minus the label's step); a label outside it names weights that no checkpoint
kept (``orphaned``): trajectories generated with them are dropped and counted. A label that does
not parse is ``unknown_version``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from services.protocol.weights import INITIAL_VERSION, parse_version_label

EPOCH_FILE = "EPOCH"


class Unresolved(Exception):
    """A label that names no ancestor of the current weights; ``reason`` is the drop reason."""

    def __init__(self, reason: str, version: str) -> None:
        super().__init__(f"{reason}: {version!r}")
        self.reason = reason


class Lineage(BaseModel):
    """epoch -> [first step, last step] of the weights this run builds on (in the checkpoint)."""

    spans: dict[int, list[int]] = Field(default_factory=dict)

    def extend(self, epoch: int, step: int) -> None:
        """The weights of ``step`` were trained by ``epoch`` on top of the lineage."""
        first = self.spans.get(epoch, [step, step])[0]
        self.spans[epoch] = [first, step]

    def step_of(self, version: str) -> int:
        """The optimizer step that produced ``version``; raises :class:`Unresolved` if not an ancestor."""
        if version == INITIAL_VERSION:
            return 0
        parsed = parse_version_label(version)
        if parsed is None:
            raise Unresolved("unknown_version", version)
        step, epoch = parsed
        span = self.spans.get(epoch)
        if span is None or not span[0] <= step <= span[1]:
            raise Unresolved("orphaned", version)
        return step


def next_epoch(directory: Path) -> int:
    """Increment the epoch counter file durably (write, fsync, rename) and return the new epoch."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / EPOCH_FILE
    epoch = int(path.read_text().strip() or 0) + 1 if path.exists() else 1
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return epoch

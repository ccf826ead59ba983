"""The notice that a new policy version is ready."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from services.protocol.fields import MAX_TIMEOUT_S, Name, Text

# Weight versions. Written by the trainer (``WeightUpdate.version``), reported by every engine and
# stamped on every generated token (``Turn.weight_version``); the trainer parses them back to the
# optimizer step that made the weights (staleness).
INITIAL_VERSION = "0"  # the trainer's initial weights, the same at every start
ENGINE_DEFAULT_VERSION = "default"  # what an engine reports before any update (SGLang's own default)
_VERSION_LABEL = re.compile(r"^(\d+)-e(\d+)$")


def version_label(step: int, epoch: int) -> str:
    """``"0"`` for the initial weights, else ``"<step>-e<epoch>"``: the weights after optimizer step
    ``step`` trained by the trainer's run epoch ``epoch`` (a new epoch at every trainer start)."""
    return INITIAL_VERSION if step == 0 else f"{step}-e{epoch}"


def parse_version_label(version: str) -> tuple[int, int] | None:
    """``(step, epoch)`` of a label made by :func:`version_label` past the initial one; else None."""
    match = _VERSION_LABEL.match(version)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


CHECKSUM_FILE = "CHECKSUM"  # in every export: the checksum of the other files, written last
# An engine host's own route (not SGLang's): fetch an export from the weight store into local
# disk and verify its checksum. Body {"location", "checksum"}; answer {"success", "path"|"message"}.
STAGE_WEIGHTS_PATH = "/rollout/stage_weights"


def tree_checksum(files: Iterable[tuple[str, Iterable[bytes]]]) -> str:
    """``sha256:<hex>`` over an export's files (name, then content chunks), given in name order,
    each as ``name \\0 bytes \\0``. The trainer computes it when it exports; an engine host
    recomputes it over what it fetched before the engines switch."""
    digest = hashlib.sha256()
    for name, chunks in files:
        digest.update(name.encode() + b"\0")
        for chunk in chunks:
            digest.update(chunk)
        digest.update(b"\0")
    return f"sha256:{digest.hexdigest()}"


class WeightUpdate(BaseModel):
    """Posted by a trainer to the proxy's ``/admin/weights``; one transaction per pool.

    ``version`` is what every engine must report afterwards and what every generated token is
    stamped with; ``location`` is where the export is: a directory every engine host sees at
    that path, or a weight store URL (``file:///shared/weights/v7``, ``s3://bucket/prefix/v7``)
    that each engine host fetches from into its own disk; ``checksum`` lets the engine hosts
    refuse a half-written or corrupted export before any engine switches.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    pool: Name
    version: str = Field(min_length=1, max_length=128)
    location: Text = Field(min_length=1, max_length=4096)
    checksum: str = Field(min_length=1, max_length=256)  # "sha256:<hex>" over the exported files
    pause_mode: Literal["retract", "in_place", "abort"] = "retract"
    hold_timeout_s: float = Field(300.0, gt=0, le=MAX_TIMEOUT_S)  # how long new calls may wait at the proxy


class EngineUpdateResult(BaseModel):
    """One engine's part in a weight-update transaction."""

    engine_id: str
    ok: bool
    stage_s: float = 0.0  # its host fetched the export and verified the checksum (before the pause)
    pause_s: float = 0.0
    update_s: float = 0.0
    verify_s: float = 0.0
    version: str | None = None  # what the engine reported afterwards
    error: str | None = None  # why it was quarantined


class WeightUpdateResult(BaseModel):
    """The proxy's verdict on ``POST /admin/weights``."""

    pool: str
    version: str
    ok: bool  # every engine that stayed in the pool reports ``version``
    engines: list[EngineUpdateResult]
    quarantined: list[str]  # engines that failed and left the pool
    held_calls: int  # calls that waited at the proxy during the update
    held_s: float  # how long new calls were held
    total_s: float

"""The notice that a new policy version is ready."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from services.protocol.tasks import MAX_TIMEOUT_S, Name, Text


class WeightUpdate(BaseModel):
    """Posted by a trainer to the proxy's ``/admin/weights``; one transaction per pool.

    ``version`` is what every engine must report afterwards and what every generated token is
    stamped with; ``location`` is a directory of Hugging Face safetensors the engines can read;
    ``checksum`` lets the engines and the proxy refuse a half-written export.
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

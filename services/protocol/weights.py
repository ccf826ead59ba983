"""The notice that a new policy version is ready."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from services.protocol.tasks import Name


class WeightUpdate(BaseModel):
    """Posted by a trainer to the proxy's ``/admin/weights``; one transaction per pool.

    ``version`` is what every engine must report afterwards and what every generated token is
    stamped with; ``location`` is a directory of Hugging Face safetensors the engines can read;
    ``checksum`` lets the engines and the proxy refuse a half-written export.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: Name
    version: str = Field(min_length=1, max_length=128)
    location: str = Field(min_length=1)
    checksum: str = Field(min_length=1)  # "sha256:<hex>" over the exported files
    pause_mode: Literal["retract", "in_place", "abort"] = "retract"
    hold_timeout_s: float = Field(300.0, gt=0)  # how long new calls may wait at the proxy

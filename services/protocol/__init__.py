"""The wire contract shared by every part of the platform.

Pure: no I/O, no imports from the rest of the repository. Services, workers and the trainer
import it; it imports only pydantic and msgspec.

Its names are loaded on first use (PEP 562): ``from services.protocol import Task`` imports
``tasks`` alone, and a process that needs one submodule (an engine: ``weights``) does not build the
others' models (about 0.15 s of CPU at every start of an engine or proxy process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.protocol.errors import ErrorBody, ErrorDetail, PlatformError
    from services.protocol.status import INFRA_CODES, Cap, ErrorCode, InfraStage, Status
    from services.protocol.tasks import (
        AgentLimits,
        RewardSpec,
        RolloutRequest,
        SamplingParams,
        SandboxSpec,
        ScoredTests,
        Task,
        WorkItem,
    )
    from services.protocol.trajectory import (
        InfraFailure,
        Message,
        RewardDetails,
        Timings,
        Trajectory,
        Turn,
        decode_trajectory,
        encode_trajectory,
        from_stream_fields,
        logprobs,
        mask,
        to_stream_fields,
        token_ids,
        trajectory_from_json,
        trajectory_to_json,
    )
    from services.protocol.weights import WeightUpdate

_EXPORTS = {  # submodule -> the names it defines that the package exports
    "errors": ("ErrorBody", "ErrorDetail", "PlatformError"),
    "status": ("INFRA_CODES", "Cap", "ErrorCode", "InfraStage", "Status"),
    "tasks": ("AgentLimits", "RewardSpec", "RolloutRequest", "SamplingParams", "SandboxSpec", "ScoredTests", "Task",
              "WorkItem"),
    "trajectory": ("InfraFailure", "Message", "RewardDetails", "Timings", "Trajectory", "Turn", "decode_trajectory",
                   "encode_trajectory", "from_stream_fields", "logprobs", "mask", "to_stream_fields", "token_ids",
                   "trajectory_from_json", "trajectory_to_json"),
    "weights": ("WeightUpdate",),
}  # fmt: skip
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


__all__ = [
    "INFRA_CODES",
    "AgentLimits",
    "Cap",
    "ErrorBody",
    "ErrorCode",
    "ErrorDetail",
    "InfraFailure",
    "InfraStage",
    "Message",
    "PlatformError",
    "RewardDetails",
    "RewardSpec",
    "RolloutRequest",
    "SamplingParams",
    "SandboxSpec",
    "ScoredTests",
    "Status",
    "Task",
    "Timings",
    "Trajectory",
    "Turn",
    "WeightUpdate",
    "WorkItem",
    "decode_trajectory",
    "encode_trajectory",
    "from_stream_fields",
    "logprobs",
    "mask",
    "to_stream_fields",
    "token_ids",
    "trajectory_from_json",
    "trajectory_to_json",
]

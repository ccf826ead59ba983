"""The wire contract shared by every part of the platform.

Pure: no I/O, no imports from the rest of the repository. Services, workers and the trainer
import it; it imports only pydantic and msgspec.
"""

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

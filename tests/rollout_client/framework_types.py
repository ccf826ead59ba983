"""The frameworks' own sample types, rebuilt from their published definitions (neither slime nor verl
installs on this machine), so the adapters are checked against exactly what the frameworks read.

- slime ``Sample``: THUDM/slime ``slime/utils/types.py`` at commit 7985bf23a5a043f51bc1411ef2bb115ee6a2e174
  (the fields and their types; the spec/prefix-cache helpers omitted);
- verl ``AgentLoopMetrics`` / ``AgentLoopOutput``: volcengine/verl
  ``verl/experimental/agent_loop/agent_loop.py`` at commit 6c923f3b724ad8a3647e9fc818e485c078703d07.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic import BaseModel


@dataclass
class SlimeSample:
    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    raw_prompt: list[dict[str, str]] | None = None
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0


class VerlAgentLoopMetrics(BaseModel):
    generate_sequences: float = 0.0
    tool_calls: float = 0.0


class VerlAgentLoopOutput(BaseModel):
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: VerlAgentLoopMetrics
    extra_fields: dict[str, Any] = {}

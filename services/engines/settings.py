"""``ROLLOUT_ENGINE_*``: one settings object for an engine process (it may serve several engines)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    """How the simulated engines behave. Times are seconds, sizes are tokens."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_ENGINE_", extra="ignore")

    mode: Literal["sim", "scripted", "torch"] = "sim"  # torch: a real (tiny) HF model from model_path
    host: str = "127.0.0.1"
    port: int = 30000
    count: int = Field(1, ge=1)  # engines served by this process, on ports port..port+count-1
    model_path: Path | None = None  # an HF tokenizer directory; None: token ids only
    served_model_name: str = "sim-model"
    script: Path | None = None  # scripted mode: the replies file
    seed: int = 0
    weight_version: str = "default"  # what the engine reports before any update
    context_length: int = Field(65_536, gt=1)
    max_running_requests: int = Field(256, ge=1)
    kv_capacity_tokens: int = Field(1_500_000, ge=1)  # KV cache size; requests wait when it is full
    prefill_s_per_token: float = Field(2e-7, ge=0)  # prefill cost of each uncached prompt token
    decode_step_s: float = Field(0.02, ge=0)  # decode step time with one request running
    decode_step_per_request_s: float = Field(2e-4, ge=0)  # added per running request in the step
    output_tokens: int = Field(100, ge=1)  # sim: mean reply length (uniform in [0.5x, 1.5x])
    runaway_fraction: float = Field(0.0, ge=0, le=1)  # sim: share of requests that never emit EOS
    eos_token_id: int = 258  # used when there is no tokenizer (matches the bundled one)
    vocab_size: int = 259
    weight_load_s: float = Field(0.05, ge=0)  # how long update_weights_from_disk takes
    fail_weight_updates: bool = False  # fault injection: every weight update fails
    prefix_cache_entries: int = Field(4096, ge=0)  # prompts remembered for cached_tokens
    moe_layers: int = Field(2, ge=1)  # routing replay (return_routed_experts): MoE layers reported
    moe_topk: int = Field(2, ge=1)  # experts per token per layer
    moe_experts: int = Field(8, ge=1)

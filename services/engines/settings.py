"""``ROLLOUT_ENGINE_*``: one settings object for an engine process (it may serve several engines)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.protocol.weights import ENGINE_DEFAULT_VERSION
from services.runtime.settings import UsesAdminToken


class EngineSettings(UsesAdminToken):
    """How the simulated engines behave. Times are seconds, sizes are tokens."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_ENGINE_")
    service_name = "engine"

    # sim / scripted / torch: stand-ins served by this process; sglang: a real SGLang server started
    # by this process (`python -m sglang.launch_server`, GPU hosts, the [engine] extra)
    mode: Literal["sim", "scripted", "torch", "sglang"] = "sim"  # torch: a real (tiny) HF model from model_path
    host: str = "127.0.0.1"
    port: int = 30000
    count: int = Field(1, ge=1)  # engines served by this process, on ports port..port+count-1
    model_path: Path | None = None  # an HF tokenizer directory; None: token ids only
    served_model_name: str = "sim-model"
    script: Path | None = None  # scripted mode: the replies file
    seed: int = 0
    weight_version: str = ENGINE_DEFAULT_VERSION  # what the engine reports before any update
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
    # Joining a proxy pool: once healthy, each engine registers itself (POST /admin/engines) at the
    # address the proxy reaches it by, and leaves the pool (/admin/engines/remove) when it stops.
    proxy_url: str | None = None  # None: the proxy's own engine list names this engine (joining needs admin_token)
    pool: str = "default"
    advertise_host: str | None = None  # how the proxy reaches this host (pod IP, DNS name); default: host
    # how often a joined engine checks it is still in the proxy's membership: after the proxy's store
    # came back empty (a new store generation) it joins again; one removed by an operator stays out
    rejoin_check_s: float = Field(5.0, gt=0)
    # sglang mode only (see services/engines/sglang.py for the command line built from these)
    tp_size: int = Field(1, ge=1)  # GPUs per engine (tensor parallel)
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)  # weights + KV share of GPU memory
    return_routed_experts: bool = False  # MoE routing replay: per-token routed experts in meta_info
    sglang_args: list[str] = []  # extra flags passed through as they are
    startup_timeout_s: float = Field(1800.0, gt=0)  # model download/load + CUDA graph capture
    # weight store: exports named by URL (file://, s3://) are fetched here and verified first
    weight_cache_dir: Path = Path("/tmp/rollout-weights")
    stage_port: int | None = None  # sglang mode: the launcher's /rollout/stage_weights port (default port + 1)
    moe_layers: int = Field(2, ge=1)  # routing replay (return_routed_experts): MoE layers reported
    moe_topk: int = Field(2, ge=1)  # experts per token per layer
    moe_experts: int = Field(8, ge=1)

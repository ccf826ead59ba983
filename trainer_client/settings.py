"""The trainer's settings: one pydantic-settings class, ``ROLLOUT_TRAIN_*`` (nested with ``__``).

The shared settings (Redis URL, admin token, log level) resolve like every service's
(:mod:`services.runtime.settings`): ``ROLLOUT_TRAIN_<NAME>``, then ``ROLLOUT_<NAME>``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.protocol import keys
from services.protocol.fields import Name
from services.protocol.tasks import AgentLimits, SamplingParams
from services.runtime.settings import UsesAdminToken, UsesRedis
from trainer_client.evaluation import EvalConfig
from trainer_client.learner import LossConfig
from trainer_client.model import ModelConfig, OptimConfig, ParallelConfig
from trainer_client.sft import SftConfig


class TrainSettings(UsesRedis, UsesAdminToken):
    """Everything ``rollout-train`` needs; e.g. ``ROLLOUT_TRAIN_MODEL__HIDDEN_SIZE=256``."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_TRAIN_", env_nested_delimiter="__")
    service_name = "trainer"

    job: str = "demo"
    consumer_group: str = keys.TRAINERS_GROUP
    # rollout API: without it the trainer only consumes what already flows into the job's stream
    api_url: str | None = None
    api_token: str | None = Field(None, repr=False)  # the job's bearer token (also the proxy's, for its pool)
    tasks_path: Path | None = None  # JSONL of services.protocol.tasks.Task, cycled through
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    # LLM proxy: without it exports are written but not announced
    proxy_url: str | None = None
    proxy_token: str | None = Field(None, repr=False)  # for /admin/weights; None: api_token, else admin_token
    # the proxy pool to update: None takes the job's pool from the API (GET /jobs/{job}); a value that
    # differs from the job's is refused at start. Without the API: this value, else "default".
    pool: Name | None = None
    weight_store_url: str | None = None  # None: announce the export path; file:///shared or s3://bucket/prefix
    sync_timeout_s: float = Field(600.0, gt=0)
    # model, optimizer, loss
    model: ModelConfig = Field(default_factory=ModelConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    sft: SftConfig = Field(default_factory=SftConfig)  # a supervised phase before GRPO (fresh runs)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)  # held-out pass@1 during the run
    tokenizer_dir: Path | None = None  # copied into every export
    init_from: Path | None = None  # HF Llama directory to start from (else a seeded random init)
    # GRPO batch and staleness
    group_size: int = Field(8, ge=1)
    batch_groups: int = Field(4, ge=1)  # groups per optimizer step
    min_valid: int = Field(2, ge=1)  # fewer valid members: the group is dropped
    max_staleness: int = Field(2, ge=0)  # versions; also sets the admission cap (max_staleness + 1) x batch_groups
    overprovision: float = Field(2.0, ge=1.0)  # groups kept in flight / batch_groups (capped by admission)
    group_timeout_s: float = Field(3600.0, gt=0)  # an open group missing members is settled after this
    micro_batch_tokens: int = Field(8192, ge=8)  # token slots per micro-batch (gradients accumulate over them)
    packing: bool = True  # pack whole sequences into rows (no padding); False pads rows to the longest
    max_seq_len: int = Field(4096, ge=8)
    # run
    max_steps: int = Field(100, ge=1)  # GRPO steps (the SFT phase's steps come on top)
    checkpoint_every: int = Field(1, ge=1)
    export_every: int = Field(1, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    work_dir: Path = Path("runs/trainer")  # checkpoints/, exports/, steps.jsonl, steps.png
    read_count: int = Field(256, ge=1)
    read_block_ms: int = Field(200, ge=1)
    wait_timeout_s: float = Field(3600.0, gt=0)  # give up when no batch completes for this long
    metrics_port: int | None = None  # serve Prometheus /metrics while training
    plot: bool = True

    @property
    def checkpoint_dir(self) -> Path:
        return self.work_dir / "checkpoints"

    @property
    def export_dir(self) -> Path:
        return self.work_dir / "exports"

    @property
    def step_log(self) -> Path:
        return self.work_dir / "steps.jsonl"

"""What users submit: tasks, agent limits, sampling parameters, rollout requests; and the
work item a worker takes from a job's work stream.

Pydantic models: these cross the HTTP boundary, where validation errors must name the field.
Every number is finite (NaN and infinities are refused) and bounded by the maximum written
beside it; strings that reach a process (commands, paths, env) carry no NUL byte, and env keys
are shell names (docs/security.md, "Input validation").
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

# Job, pool, task and template names end up inside Redis keys and URLs: keep them tame.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")]

# Reaches a process (argv, shell, env value, path): no NUL byte, which no exec or open() can carry.
Text = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
EnvKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
FilePath = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^[^\x00]*[^\x00/]$")]

MAX_MEMORY_MB = 1_048_576  # 1 TiB
MAX_DISK_MB = 1_048_576
MAX_TIMEOUT_S = 86_400.0  # one day, for any single timeout or TTL
MAX_TOKENS = 4_194_304  # per turn or per trajectory

DEFAULT_MAX_TURNS = 80
DEFAULT_MAX_TOKENS_PER_TURN = 8_192
DEFAULT_MAX_TRAJECTORY_TOKENS = 65_536
DEFAULT_CONTEXT_LENGTH = 65_536
DEFAULT_GROUP_SIZE = 8


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SandboxSpec(_Model):
    """The sandbox an episode runs in. Written by the user, read by the worker and broker."""

    template: Name = "default"  # a template registered with the broker
    cpus: float = Field(1.0, gt=0, le=64)
    memory_mb: int = Field(2048, gt=0, le=MAX_MEMORY_MB)
    disk_mb: int = Field(10_240, gt=0, le=MAX_DISK_MB)
    network: Literal["none", "egress"] = "none"  # no network unless asked for
    setup: list[Text] = Field(default_factory=list, max_length=1_000)  # shell commands before the first turn
    files: dict[FilePath, str] = Field(default_factory=dict)  # path -> content written before setup
    env: dict[EnvKey, Text] = Field(default_factory=dict)
    workdir: FilePath = "/workspace"


class RewardSpec(_Model):
    """How the episode is scored once the agent stops."""

    command: Text  # run in the sandbox; exit 0 -> 1.0 else 0.0, unless ``parse_float``
    parse_float: bool = False  # the last line of stdout is the reward (a float)
    timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)
    files: dict[FilePath, str] = Field(default_factory=dict)  # fresh test files written before the command


class Task(_Model):
    """One problem. Written by the user (or an adapter), read by the worker."""

    id: Name
    prompt: str = Field(min_length=1)  # the problem statement shown to the agent
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    reward: RewardSpec
    metadata: dict[str, Any] = Field(default_factory=dict)  # carried to the trajectory untouched

    @model_validator(mode="after")
    def _no_path_climbs_out(self) -> Task:
        """A file path the broker would refuse is the user's error now (400), not an infra error later."""
        for field, files in (("sandbox.files", self.sandbox.files), ("reward.files", self.reward.files)):
            for path in files:
                if ".." in path.split("/"):
                    raise ValueError(f"{field}: {path!r} must not contain '..'")
        return self


class AgentLimits(_Model):
    """Caps of one episode; every one that stops a trajectory is named in it."""

    max_turns: int = Field(DEFAULT_MAX_TURNS, ge=1, le=10_000)
    max_tokens_per_turn: int = Field(DEFAULT_MAX_TOKENS_PER_TURN, ge=1, le=MAX_TOKENS)
    max_trajectory_tokens: int = Field(DEFAULT_MAX_TRAJECTORY_TOKENS, ge=16, le=MAX_TOKENS)
    wall_clock_s: float = Field(3_600.0, gt=0, le=7 * MAX_TIMEOUT_S)
    command_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S)
    observation_max_bytes: int = Field(10_000, ge=256, le=16_000_000)  # command output shown (head + tail)


class SamplingParams(BaseModel):
    """SGLang sampling parameters. Unknown keys are passed to the engine untouched."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    temperature: float = Field(1.0, ge=0, le=100)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=1_000_000)
    stop: list[str] = Field(default_factory=list, max_length=64)


class RolloutRequest(_Model):
    """``POST /rollouts``: a batch of tasks for one job."""

    job: Name
    tasks: list[Task] = Field(min_length=1)
    group_size: int = Field(DEFAULT_GROUP_SIZE, ge=1, le=1024)  # samples per task (a GRPO group)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(0, ge=-100, le=100)  # higher first within the job
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    max_attempts: int = Field(3, ge=1, le=10)  # infra retries per trajectory, first attempt included


class WorkItem(_Model):
    """One sample of one task, as queued on the job's work stream.

    Written by the API, read by workers. A retry after an infra failure is the same item with
    ``attempt`` + 1; ``trajectory_id`` never changes.
    """

    job: Name
    rollout_id: str
    trajectory_id: str
    task: Task
    group_id: str  # the GRPO group: rollout x task
    sample_index: int = Field(ge=0)
    group_size: int = Field(ge=1)
    attempt: int = Field(1, ge=1)
    max_attempts: int = Field(3, ge=1)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    pool: Name = "default"  # the proxy pool that serves this job's policy
    priority: int = 0
    enqueued_at: float = 0.0  # unix seconds

    @staticmethod
    def make_trajectory_id(rollout_id: str, task_id: str, sample_index: int) -> str:
        return f"{rollout_id}:{task_id}:{sample_index}"

    @staticmethod
    def make_group_id(rollout_id: str, task_id: str) -> str:
        return f"{rollout_id}:{task_id}"

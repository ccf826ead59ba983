"""What users submit: tasks, agent limits, sampling parameters, rollout requests; and the
work item a worker takes from a job's work stream.

Pydantic models: these cross the HTTP boundary, where validation errors must name the field.
Every number is finite (NaN and infinities are refused) and bounded by the maximum written
beside it; strings that reach a process (commands, paths, env) carry no NUL byte, and env keys
are shell names (docs/security.md, "Input validation").
"""

from __future__ import annotations

import json
import math
import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from services.protocol.agents import AgentSpec, BashAgent
from services.protocol.fields import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_TOKENS_PER_TURN,
    DEFAULT_MAX_TRAJECTORY_TOKENS,
    DEFAULT_MAX_TURNS,
    DEFAULT_POOL,
    MAX_DEPTH,
    MAX_DISK_MB,
    MAX_INT,
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MAX_TOKENS,
    MIN_CPUS,
    MIN_INT,
    EnvKey,
    FilePath,
    Isolation,
    Name,
    SourceVersion,
    Text,
)


def _check_value(value: Any, path: str, depth: int = 0) -> None:
    """ValueError naming ``path`` for a value the trajectory codec cannot carry."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
        raise ValueError(f"{path}: the integer {value} is outside -2**63 .. 2**64-1")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: {value} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_value(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_value(item, f"{path}.{index}", depth + 1)


def _carried(metadata: dict[str, Any]) -> dict[str, Any]:
    for key, value in metadata.items():
        _check_value(value, key)
    return metadata


# Any JSON, within what the trajectory codec carries (a value past it failed every delivery of its item)
Metadata = Annotated[dict[str, Any], AfterValidator(_carried)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SandboxSpec(_Model):
    """The sandbox an episode runs in. Written by the user, read by the worker and broker."""

    template: Name = "default"  # a template registered with the broker
    cpus: float = Field(1.0, ge=MIN_CPUS, le=64)
    memory_mb: int = Field(2048, gt=0, le=MAX_MEMORY_MB)
    disk_mb: int = Field(10_240, gt=0, le=MAX_DISK_MB)
    network: Literal["none", "egress"] = "none"  # no network unless asked for
    isolation: Isolation | None = None  # the broker refuses a level it cannot give (422 naming it)
    setup: list[Text] = Field(default_factory=list, max_length=1_000)  # shell commands before the first turn
    files: dict[FilePath, str] = Field(default_factory=dict)  # path -> content written before setup
    env: dict[EnvKey, Text] = Field(default_factory=dict)  # every command, the agent's and the reward's
    workdir: FilePath | None = None  # where every command starts; None: the sandbox's (the image's WorkingDir)


class ScoredTests(_Model):
    """Per-test scoring (SWE-bench style): the reward is 1 only if every FAIL_TO_PASS test passes and
    no PASS_TO_PASS test fails, as parsed from the reward command's output."""

    fail_to_pass: list[str] = Field(min_length=1)
    pass_to_pass: list[str] = Field(default_factory=list)
    # auto: every format found; swebench: the official package's parser named by ``swebench_parser``
    # (where pytest's own report is missing: docs/rollout_api.md)
    log_parser: Literal["auto", "pytest", "unittest", "django", "swebench"] = "auto"
    swebench_parser: Annotated[str, StringConstraints(pattern=r"^parse_log_\w{1,100}$")] | None = None

    @model_validator(mode="after")
    def _parser_named(self) -> ScoredTests:
        if (self.log_parser == "swebench") != (self.swebench_parser is not None):
            raise ValueError("swebench_parser names the parser of log_parser 'swebench' (and only then)")
        return self


class RewardSpec(_Model):
    """How the episode is scored once the agent stops."""

    command: Text  # run in the sandbox; exit 0 -> 1.0 else 0.0, unless ``parse_float`` or ``tests``
    parse_float: bool = False  # the last line of stdout is the reward (a float)
    timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)
    files: dict[FilePath, str] = Field(default_factory=dict)  # fresh test files written before the command
    # files read after the task's setup, before the agent's first turn, and put back (or removed, if
    # they did not exist) before scoring: the agent's changes to them never count
    restore: list[FilePath] = Field(default_factory=list, max_length=1_000)
    setup: list[Text] = Field(default_factory=list)  # run before ``command``; a failure is an infra error
    tests: ScoredTests | None = None  # per-test scoring instead of the exit code
    # where the reward runs: "same", the agent's sandbox (after ``restore``); "fresh", a new sandbox from
    # the same template and setup with only the agent's diff against the base commit applied, tests and
    # test infrastructure (conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml, *.pth, ...)
    # and ``restore`` paths never taken from it (the working directory must be a git repository's root)
    grade_in: Literal["fresh", "same"] = "same"


class Task(_Model):
    """One problem. Written by the user (or an adapter), read by the worker."""

    id: Name
    prompt: str = Field(min_length=1)  # the problem statement shown to the agent
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    reward: RewardSpec
    metadata: Metadata = Field(default_factory=dict)  # carried to the trajectory untouched
    agent: AgentSpec | None = None  # overrides the rollout request's agent for this task
    # where the task was defined (docs/environments.md): "platform" for the platform's own tasks, else
    # the adapter's source ("swebench", "swe-smith", "harbor", ...) and that set's version; both are
    # copied onto every trajectory of the task
    source: Name = "platform"
    source_version: SourceVersion = ""

    @model_validator(mode="after")
    def _no_path_climbs_out(self) -> Task:
        """A file path the broker would refuse is the user's error now (400), not an infra error later."""
        files = (("sandbox.files", self.sandbox.files), ("reward.files", self.reward.files))
        for field, paths in (*files, ("reward.restore", self.reward.restore)):
            for path in paths:
                if ".." in path.split("/"):
                    raise ValueError(f"{field}: {path!r} must not contain '..'")
        for path in self.reward.restore:  # a file or a directory below the working directory, not all of it
            if posixpath.normpath(path) in (".", "/"):
                raise ValueError(f"reward.restore: {path!r} names the whole working directory")
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


RolloutMode = Literal["train", "eval"]  # eval: never trained on (its own stream), scored as pass@k
MAX_SEED = 2**31 - 1


class EvalOptions(_Model):
    """How an evaluation rollout samples and is scored (``mode="eval"``; docs/rollout_api.md).

    Sample ``i`` of the request's task ``t`` (its position) is drawn with the fixed seed
    ``seed + t * group_size + i`` (SGLang's ``sampling_seed``, modulo 2**31), so an evaluation is
    reproducible at any temperature, and no two samples share their random draws (with one seed
    for every task, tasks that differ only a little would be sampled alike, and pass@1 over them
    would be a few draws, not one per task). At temperature 0 it is greedy. A sample passes when
    its reward is at least ``threshold``.
    """

    seed: int = Field(0, ge=0, le=MAX_SEED - 1024)
    k: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=16)  # pass@k reported for each
    threshold: float = Field(1.0, ge=-1e9, le=1e9)


class RolloutOptions(_Model):
    """What every rollout request carries beside its tasks (``RolloutRequest``, ``SweBenchRolloutRequest``)."""

    job: Name
    group_size: int = Field(DEFAULT_GROUP_SIZE, ge=1, le=1024)  # samples per task (a GRPO group)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(0, ge=-100, le=100)  # higher first within the job
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    max_attempts: int = Field(3, ge=1, le=10)  # infra retries per trajectory, first attempt included
    agent: AgentSpec = Field(default_factory=BashAgent)  # the agent of every task that names none
    mode: RolloutMode = "train"  # "eval": trajectories go to the job's eval stream, never to its trainer
    eval: EvalOptions | None = None  # with mode "eval" (its defaults when None)

    @model_validator(mode="after")
    def _eval_fits(self) -> RolloutOptions:
        if self.eval is not None and self.mode != "eval":
            raise ValueError("eval options need mode 'eval'")
        for k in self.eval.k if self.eval else ():
            if not 1 <= k <= self.group_size:
                raise ValueError(f"eval.k: {k} must be between 1 and group_size ({self.group_size})")
        return self

    @property
    def eval_options(self) -> EvalOptions | None:
        """The evaluation options in force: None for a training rollout."""
        return (self.eval or EvalOptions()) if self.mode == "eval" else None

    def sampling_for(self, sample_index: int, task_index: int = 0) -> SamplingParams:
        """The sampling of one sample: an evaluation's carries its own fixed seed (``EvalOptions``)."""
        options = self.eval_options
        if options is None:
            return self.sampling
        seed = (options.seed + task_index * self.group_size + sample_index) % (MAX_SEED + 1)
        return self.sampling.model_copy(update={"sampling_seed": seed})

    def options(self) -> dict[str, Any]:
        """These fields, to build another request kind with the same options."""
        return {name: getattr(self, name) for name in RolloutOptions.model_fields}


class RolloutRequest(RolloutOptions):
    """``POST /rollouts``: a batch of tasks for one job."""

    tasks: list[Task] = Field(min_length=1)


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
    pool: Name = DEFAULT_POOL  # the proxy pool that serves this job's policy
    priority: int = 0
    enqueued_at: float = 0.0  # unix seconds
    agent: AgentSpec = Field(default_factory=BashAgent)  # the task's agent, else the request's
    mode: RolloutMode = "train"  # "eval": published to the job's eval stream (``keys.eval_stream``)

    def encode(self) -> bytes:
        """The work stream's ``item`` field: everything but the task, named by ``task_id``. The task
        is stored once per rollout (``keys.rollout_tasks``), so ``group_size`` copies cost no more
        than their ids: a request's size in Redis stays a small multiple of its body."""
        doc = self.model_dump(mode="json", exclude={"task"})
        doc["task_id"] = self.task.id
        return json.dumps(doc, separators=(",", ":")).encode()

    @staticmethod
    def task_ref(raw: bytes) -> tuple[str, str]:
        """``(rollout_id, task_id)`` of an encoded item; ValueError when it names none."""
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("task_id"), str):
            raise ValueError("the work item names no task")
        return str(doc.get("rollout_id")), doc["task_id"]

    @classmethod
    def decode(cls, raw: bytes, task: Task) -> WorkItem:
        """An encoded item with its task put back; pydantic's ValidationError (a ValueError) if invalid."""
        doc = json.loads(raw)
        doc.pop("task_id", None)
        return cls.model_validate({**doc, "task": task})

    @staticmethod
    def make_trajectory_id(rollout_id: str, task_id: str, sample_index: int) -> str:
        return f"{rollout_id}:{task_id}:{sample_index}"

    @staticmethod
    def make_group_id(rollout_id: str, task_id: str) -> str:
        return f"{rollout_id}:{task_id}"

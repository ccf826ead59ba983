"""The trajectory record: what a worker publishes and a trainer consumes, and its codec.

msgspec Structs: this is the hot, large record (up to 64K tokens), and it must encode, cross
Redis and decode in a few milliseconds. Token arrays are :class:`array.array` end to end
(``'i'`` int32 token ids, ``'f'`` float32 logprobs, ``'B'`` uint8 loss mask), packed as raw
little-endian bytes on the wire, never as lists of numbers. A trainer turns them into tensors
without a copy (``torch.frombuffer``).

Token layout of a multi-turn episode: ``prompt_ids`` is the first prompt (system + task).
``response_ids`` is everything after it, in order: each turn's generated tokens followed by the
tokens of the next observation message. ``loss_mask`` and ``response_logprobs`` are aligned with
``response_ids``: mask 1 and the engine's logprob on generated tokens, mask 0 and logprob 0.0 on
observation (tool) tokens. ``Turn.response_offset`` locates each turn's generated tokens.

Agents served by the gateway (``tools``, ``command``) may rewrite their history (summaries,
truncation, sub-agents). A call whose prompt does not extend the open token sequence starts a new
:class:`Segment`: the top-level token fields hold the first segment, ``segments`` the later
ones, each token-exact with its own loss mask. Trainers train on every segment.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import msgspec

from services.protocol.status import Cap, InfraStage, Status

_LITTLE = sys.byteorder == "little"


def token_ids(values: Any = ()) -> array:  # type: ignore[type-arg]
    """An int32 token-id array."""
    return array("i", values)


def logprobs(values: Any = ()) -> array:  # type: ignore[type-arg]
    """A float32 logprob array."""
    return array("f", values)


def mask(values: Any = ()) -> array:  # type: ignore[type-arg]
    """A uint8 loss-mask array."""
    return array("B", values)


class Message(msgspec.Struct, frozen=True):
    """A readable chat message (optional; for people and debugging, never for training)."""

    role: str
    content: str


class Turn(msgspec.Struct, kw_only=True):
    """One agent turn: an LLM call, and the command it ran (if any)."""

    index: int  # 0-based
    response_offset: int  # where this turn's generated tokens start in ``response_ids``
    response_tokens: int  # how many tokens the model generated this turn
    prompt_tokens: int  # context length sent to the engine this turn
    cached_tokens: int = 0  # prefix-cache hits reported by the engine
    weight_version: str  # the policy version that generated this turn
    engine_id: str  # the engine that served the call
    finish_reason: str  # "stop" | "length" | "abort"
    llm_s: float  # wall time of the LLM call
    exec_s: float = 0.0  # wall time of the command in the sandbox
    exit_code: int | None = None  # of the command; None when no command ran
    observation_tokens: int = 0  # tokens of the tool/user message that followed


class RoutedExperts(msgspec.Struct, kw_only=True):
    """Routing replay: the engine's per-token routed experts (SGLang ``return_routed_experts``).

    ``data`` is the engine's int32 array, raw little-endian, of shape ``(rows, layers, topk)`` where
    row ``i`` is the routing of token ``i`` of ``prompt_ids + response_ids`` (the last token has none).
    """

    data: bytes
    layers: int
    topk: int

    @property
    def rows(self) -> int:
        return len(self.data) // (4 * max(1, self.layers * self.topk))


class Segment(msgspec.Struct, kw_only=True):
    """One token-exact sequence of a trajectory (same layout as the top-level token fields)."""

    prompt_ids: array = msgspec.field(default_factory=token_ids)  # type: ignore[type-arg]
    response_ids: array = msgspec.field(default_factory=token_ids)  # type: ignore[type-arg]
    loss_mask: array = msgspec.field(default_factory=mask)  # type: ignore[type-arg]
    response_logprobs: array = msgspec.field(default_factory=logprobs)  # type: ignore[type-arg]
    routed_experts: RoutedExperts | None = None
    calls: list[int] = msgspec.field(default_factory=list)  # gateway call indices merged into it

    def check(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"segment arrays disagree: {n} ids, {len(self.loss_mask)} mask, {len(self.response_logprobs)} logprobs"
            )


class AgentRun(msgspec.Struct, kw_only=True):
    """What an agent that is not the built-in bash loop did (``tools``, ``command``)."""

    kind: str  # the agent spec's kind
    exit_code: int | None = None  # of the command agent's program; None when it was stopped
    last_output: str = ""  # tail of the program's stdout+stderr (command) or the last reply (tools)
    calls: int = 0  # gateway calls recorded
    retokenization_mismatches: int = 0  # calls whose re-rendered history differed from the recorded ids
    format_errors: int = 0  # malformed tool calls fed back to the model
    session: str = ""  # the gateway session id
    # a command agent run from an agent bundle (``/opt/agents/NAME``): what exactly ran
    bundle: str = ""  # the bundle's name
    bundle_version: str = ""  # its package's version
    bundle_digest: str = ""  # ``sha256:<hex>`` over the bundle's files


class RewardDetails(msgspec.Struct, kw_only=True):
    """What the reward command did."""

    exit_code: int | None
    output: str = ""  # head and tail of its stdout+stderr
    duration_s: float = 0.0
    parsed: bool = False  # the reward was parsed from its output rather than its exit code
    tests: dict[str, str] = msgspec.field(default_factory=dict)  # test id -> PASSED|FAILED|ERROR|SKIPPED|MISSING
    dropped: list[str] = msgspec.field(default_factory=list)  # grade_in "fresh": agent's paths not applied


class InfraFailure(msgspec.Struct, kw_only=True):
    """Why the platform, not the policy, failed a trajectory."""

    stage: InfraStage
    code: str  # an ``ErrorCode`` value where one applies
    message: str
    attempts: int = 1  # how many attempts were made in all


class Timings(msgspec.Struct, kw_only=True):
    """Seconds spent per phase of the episode (the last attempt)."""

    queued_s: float = 0.0  # enqueue -> a worker took it
    sandbox_start_s: float = 0.0  # lease granted (warm or cold)
    setup_s: float = 0.0  # task setup commands (or the copy of a sandbox that ran them: setup_shared)
    setup_shared: bool = False  # the sandbox started from a copy of one set up for the same group
    llm_s: float = 0.0  # sum over turns
    exec_s: float = 0.0  # sum over turns
    reward_s: float = 0.0
    grade_s: float = 0.0  # grade_in "fresh": the grading sandbox leased and the agent's change applied (in reward_s)
    total_s: float = 0.0  # the whole attempt


def attempt_key(trajectory_id: str, attempt: int) -> str:
    """``trajectory_id#attempt``: one attempt of a trajectory as a string (the gateway's session id,
    the trainer's record of an entry's fate)."""
    return f"{trajectory_id}#{attempt}"


class Trajectory(msgspec.Struct, kw_only=True):
    """A finished episode. Written once by a worker; read by trainers and the API."""

    # identity: (trajectory_id, attempt) is unique; consumers drop duplicates of it
    trajectory_id: str
    attempt: int
    job: str
    rollout_id: str
    task_id: str
    group_id: str  # the GRPO group (rollout x task)
    sample_index: int
    group_size: int
    mode: str = "train"  # "eval": an evaluation sample, published to the eval stream; never trained on
    # outcome
    status: Status
    truncation: Cap | None = None  # set when status is truncated
    infra: InfraFailure | None = None  # set when status is infra_error
    reward: float | None = None  # set exactly when status is trainable; None for infra_error and cancelled
    reward_details: RewardDetails | None = None
    # token data: see the module docstring for the layout
    prompt_ids: array = msgspec.field(default_factory=token_ids)  # type: ignore[type-arg]
    response_ids: array = msgspec.field(default_factory=token_ids)  # type: ignore[type-arg]
    loss_mask: array = msgspec.field(default_factory=mask)  # type: ignore[type-arg]
    response_logprobs: array = msgspec.field(default_factory=logprobs)  # type: ignore[type-arg]
    turns: list[Turn] = msgspec.field(default_factory=list)
    timings: Timings = msgspec.field(default_factory=Timings)
    messages: list[Message] | None = None
    segments: list[Segment] = msgspec.field(default_factory=list)  # segments after the first (history rewrites)
    routed_experts: RoutedExperts | None = None  # routing replay of the first segment, when the pool returns it
    agent: AgentRun | None = None  # set for agents served by the gateway
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)  # the task's metadata, untouched
    source: str = "platform"  # the task's source and its version (``Task.source``; docs/environments.md)
    source_version: str = ""
    worker: str = ""
    started_at: float = 0.0  # unix seconds
    finished_at: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        """The unique identity of this record."""
        return (self.trajectory_id, self.attempt)

    @property
    def attempt_key(self) -> str:
        """The identity as one string (see :func:`attempt_key`)."""
        return attempt_key(self.trajectory_id, self.attempt)

    @property
    def weight_versions(self) -> list[str]:
        """The policy version of each turn, in order."""
        return [t.weight_version for t in self.turns]

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def trainable_reward(self) -> float:
        """The reward of a trainable trajectory; ValueError for one that has none (never a fake 0)."""
        if self.reward is None or not self.status.trainable:
            raise ValueError(f"{self.trajectory_id} ({self.status.value}) has no reward to train on")
        return self.reward

    def all_segments(self) -> list[Segment]:
        """Every token-exact sequence: the top-level one first, then ``segments``."""
        first = Segment(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            loss_mask=self.loss_mask,
            response_logprobs=self.response_logprobs,
            routed_experts=self.routed_experts,
        )
        return [first, *self.segments]

    def check(self) -> None:
        """Raise ValueError if the token arrays or the outcome fields disagree."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"loss_mask ({len(self.loss_mask)}) and response_logprobs "
                f"({len(self.response_logprobs)}) must match response_ids ({n})"
            )
        for segment in self.segments:
            segment.check()
        if (self.status is Status.TRUNCATED) != (self.truncation is not None):
            raise ValueError("truncation is set exactly when status is truncated")
        if (self.status is Status.INFRA_ERROR) != (self.infra is not None):
            raise ValueError("infra is set exactly when status is infra_error")
        if self.status.trainable != (self.reward is not None):
            raise ValueError("reward is set exactly when status is completed or truncated")


# -- codec -----------------------------------------------------------------------------------

_TYPECODES = {"i": 4, "f": 4, "B": 1}


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, array):
        if obj.typecode not in _TYPECODES:
            raise TypeError(f"unsupported array typecode {obj.typecode!r}")
        if not _LITTLE and obj.itemsize > 1:
            obj = array(obj.typecode, obj)
            obj.byteswap()
        return (obj.typecode, obj.tobytes())
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is array:
        typecode, raw = obj
        if typecode not in _TYPECODES:
            raise ValueError(f"unsupported array typecode {typecode!r}")
        out = array(typecode)
        out.frombytes(raw)
        if not _LITTLE and out.itemsize > 1:
            out.byteswap()
        return out
    raise NotImplementedError(f"cannot decode {typ!r}")


def _json_enc_hook(obj: Any) -> Any:
    if isinstance(obj, array):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder(Trajectory, dec_hook=_dec_hook)
_JSON_ENCODER = msgspec.json.Encoder(enc_hook=_json_enc_hook)
_ARRAY_FIELDS = {"prompt_ids": "i", "response_ids": "i", "loss_mask": "B", "response_logprobs": "f"}


def encode_trajectory(traj: Trajectory) -> bytes:
    """Compact binary body (msgpack, token arrays as raw bytes)."""
    return _ENCODER.encode(traj)


def decode_trajectory(body: bytes) -> Trajectory:
    return _DECODER.decode(body)


def trajectory_to_json(traj: Trajectory) -> bytes:
    """Readable JSON (token arrays as lists), for HTTP consumers."""
    return _JSON_ENCODER.encode(traj)


def trajectory_from_json(data: bytes | str) -> Trajectory:
    raw = msgspec.json.decode(data)
    for part in [raw, *(raw.get("segments") or [])]:
        for name, typecode in _ARRAY_FIELDS.items():
            if name in part:
                part[name] = [typecode, array(typecode, part[name]).tobytes()]
    return msgspec.convert(raw, Trajectory, dec_hook=_dec_hook)


# -- stream entries --------------------------------------------------------------------------

# A trajectory stream entry keeps a few readable fields (for XRANGE, redis-cli and dashboards)
# beside the compact body.
ENTRY_BODY = "body"


def to_stream_fields(traj: Trajectory) -> dict[str, str | bytes]:
    """The fields of the XADD entry for ``traj``."""
    return {
        "job": traj.job,
        "task": traj.task_id,
        "trajectory": traj.trajectory_id,
        "attempt": str(traj.attempt),
        "status": traj.status.value,
        "reward": "" if traj.reward is None else repr(float(traj.reward)),  # empty: nothing to train on
        ENTRY_BODY: encode_trajectory(traj),
    }


def from_stream_fields(fields: dict[bytes, bytes] | dict[str, bytes]) -> Trajectory:
    """Decode an entry read with a client that does not decode responses."""
    raw: dict[Any, bytes] = dict(fields)
    body = raw.get(ENTRY_BODY.encode(), raw.get(ENTRY_BODY))
    if body is None:
        raise ValueError("stream entry has no body field")
    return decode_trajectory(body)

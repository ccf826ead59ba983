"""The agent gateway's contract: per-episode sessions and the per-call log they record.

A worker creates a session in Redis (``keys.gateway_session``) before it starts an agent that
is not the built-in bash loop; the proxy's gateway serves OpenAI- and Anthropic-compatible
routes under ``/e/{session}/...`` for it, authenticated by the session's token, and appends one
:class:`GatewayCall` per LLM call to ``keys.gateway_calls``. The worker turns the log into the
trajectory's token-exact segments with :func:`segments_from_calls`; it never re-tokenizes.
"""

from __future__ import annotations

import hashlib
import secrets
from array import array
from typing import Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from services.protocol.status import Cap
from services.protocol.trajectory import RoutedExperts, Segment, logprobs, mask, token_ids

SESSION_PATH = "/e/{session}"  # OpenAI clients use ``{proxy}/e/{session}/v1``; Anthropic ``{proxy}/e/{session}``
SESSION_GRACE_S = 60.0  # a session lives this long past the episode's wall clock


def new_session_token() -> str:
    """A session's token (192 random bits). It never begins with ``-``: a harness that passes it as a
    command-line value (aider's ``--openai-api-key "$OPENAI_API_KEY"``) would read one that did as an
    option, and fail 1 episode in 64."""
    return "rgs_" + secrets.token_urlsafe(24)


def token_digest(token: str) -> str:
    """What the session stores instead of its token."""
    return hashlib.sha256(token.encode()).hexdigest()


class GatewaySession(BaseModel):
    """Written once by the worker, read by every proxy process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: str  # the id in the URL path
    token_sha256: str  # of the bearer / x-api-key token the agent must send
    job: str
    trajectory_id: str
    attempt: int = Field(ge=1)
    pool: str  # the proxy pool that serves the policy
    model: str = "policy"  # the name the agent is told to use (any name is accepted)
    expires_at: float  # unix seconds; calls after it get 404
    # caps (AgentLimits of the episode)
    max_turns: int = Field(ge=1)
    max_tokens_per_turn: int = Field(ge=1)
    max_trajectory_tokens: int = Field(ge=16)
    sampling: dict[str, object] = Field(default_factory=dict)  # the rollout's SamplingParams (not the agent's)
    tool_parser: str | None = None  # None: the pool's parser
    deadline_s: float | None = None  # per LLM call


class GatewayCall(msgspec.Struct, kw_only=True):
    """One LLM call of a session, as recorded by the gateway."""

    index: int  # 0-based call number in the session
    segment: int  # the token-exact segment it belongs to
    prompt_ids: array = msgspec.field(default_factory=token_ids)  # type: ignore[type-arg]
    output_ids: array = msgspec.field(default_factory=token_ids)  # type: ignore[type-arg]
    output_logprobs: array = msgspec.field(default_factory=logprobs)  # type: ignore[type-arg]
    finish_reason: str  # the engine's: "stop" | "length" | "abort"
    weight_version: str = ""
    engine_id: str = ""
    route: Literal["chat", "completions", "messages", "responses", "gemini"] = "chat"
    merged: bool = False  # the prompt extended the segment's previous prompt + output
    mismatch: bool = False  # re-rendering the history gave other ids than recorded; recorded ids won
    tool_calls: int = 0  # calls parsed from the output
    tool_parse_errors: int = 0  # tool-call markup that did not parse
    routed_experts: RoutedExperts | None = None
    unused_fields: list[str] = msgspec.field(default_factory=list)  # request fields that did not change the tokens
    started_at: float = 0.0  # unix seconds
    llm_s: float = 0.0  # the engine call
    total_s: float = 0.0  # the whole call in the gateway


class SessionState(msgspec.Struct, kw_only=True):
    """The session's counters (``keys.gateway_state``), read and written by the gateway."""

    calls: int = 0
    tokens: int = 0  # prompt + output of the open segment's latest call (the trajectory length)
    segments: int = 0
    mismatches: int = 0
    truncated: Cap | None = None  # the cap a refused call hit
    closed: bool = False


_CALL_ENCODER = msgspec.msgpack.Encoder(enc_hook=lambda a: (a.typecode, a.tobytes()))


def _array_hook(typ: type, obj: object) -> object:
    if typ is array and isinstance(obj, list | tuple):
        out = array(obj[0])
        out.frombytes(obj[1])
        return out
    raise NotImplementedError(f"cannot decode {typ!r}")


_CALL_DECODER = msgspec.msgpack.Decoder(GatewayCall, dec_hook=_array_hook)
_STATE_CODEC = (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(SessionState))


def encode_call(call: GatewayCall) -> bytes:
    return _CALL_ENCODER.encode(call)


def decode_call(raw: bytes) -> GatewayCall:
    return _CALL_DECODER.decode(raw)


def encode_state(state: SessionState) -> bytes:
    return _STATE_CODEC[0].encode(state)


def decode_state(raw: bytes | None) -> SessionState:
    return SessionState() if not raw else _STATE_CODEC[1].decode(raw)


def segments_from_calls(calls: list[GatewayCall]) -> list[Segment]:
    """The token-exact segments of a session log: within a segment every call's prompt starts with
    the previous call's prompt + output (the gateway guarantees it), so the new prompt tail is
    appended with mask 0 and the output with mask 1 and its logprobs."""
    segments: dict[int, Segment] = {}
    for call in sorted(calls, key=lambda c: c.index):
        seg = segments.get(call.segment)
        if seg is None:
            seg = segments[call.segment] = Segment(prompt_ids=token_ids(call.prompt_ids))
        else:
            held = len(seg.prompt_ids) + len(seg.response_ids)
            if call.prompt_ids[:held] != seg.prompt_ids + seg.response_ids:
                raise ValueError(f"call {call.index} does not extend segment {call.segment}")
            tail = call.prompt_ids[held:]
            seg.response_ids.extend(tail)
            seg.loss_mask.extend(mask([0]) * len(tail))
            seg.response_logprobs.extend(logprobs([0.0]) * len(tail))
        seg.response_ids.extend(call.output_ids)
        seg.loss_mask.extend(mask([1]) * len(call.output_ids))
        seg.response_logprobs.extend(call.output_logprobs)
        seg.calls.append(call.index)
        if call.routed_experts is not None:  # the latest call covers the whole sequence so far
            seg.routed_experts = call.routed_experts
    return [segments[k] for k in sorted(segments)]

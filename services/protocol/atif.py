"""Harbor's Agent Trajectory Interchange Format (ATIF) and the trajectory record in it, both ways.

The models follow ATIF v1.4 as Harbor documents it (harborframework.com/docs/trajectory-format, the
RFC "0001-trajectory-format"): a root with ``schema_version``, ``session_id``, ``agent`` and ordered
``steps`` (``system`` | ``user`` | ``agent``); an agent step carries the model's message, optional tool
calls, the observation that followed and its ``metrics`` (token counts and, since v1.3/v1.4,
``prompt_token_ids``, ``completion_token_ids`` and per-token ``logprobs``). Unknown fields are refused
(the format's place for them is ``extra``).

A trajectory maps onto one document, token-exact:

- one ``agent`` step per turn: ``metrics.prompt_token_ids`` is everything the engine was sent that turn
  (``prompt_ids`` and the response so far), ``completion_token_ids`` / ``logprobs`` what it generated;
  the observation tokens that followed are ``extra.observation_token_ids`` (loss mask 0); the turn's
  serving facts (weight version, engine, finish reason, timings, exit code) are ``extra.turn``;
- the readable messages (when recorded) give the ``system`` / ``user`` steps and the observations' text;
- everything else of the record (identity, status, reward, timings, metadata, later segments) is the
  root's ``extra.rollout``; ``final_metrics`` sums the turns.

:func:`from_atif` rebuilds the record from such a document (and checks that every turn's prompt
extends the previous one exactly).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ATIF_VERSION = "ATIF-v1.4"
AGENT_NAME = "rollout-platform"
_TOKEN_FIELDS = ("prompt_ids", "response_ids", "loss_mask", "response_logprobs")


class _Atif(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class AtifAgent(_Atif):
    name: str
    version: str
    model_name: str | None = None
    extra: dict[str, Any] | None = None


class AtifToolCall(_Atif):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]


class AtifSubagentRef(_Atif):
    session_id: str
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None


class AtifObservationResult(_Atif):
    source_call_id: str | None = None
    content: str | None = None
    subagent_trajectory_ref: list[AtifSubagentRef] | None = None


class AtifObservation(_Atif):
    results: list[AtifObservationResult]


class AtifMetrics(_Atif):
    prompt_tokens: int | None = Field(None, ge=0)
    completion_tokens: int | None = Field(None, ge=0)
    cached_tokens: int | None = Field(None, ge=0)  # a subset of prompt_tokens
    cost_usd: float | None = Field(None, ge=0)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _cached_within_prompt(self) -> AtifMetrics:
        if (
            self.cached_tokens is not None
            and self.prompt_tokens is not None
            and self.cached_tokens > self.prompt_tokens
        ):
            raise ValueError("cached_tokens counts a subset of prompt_tokens")
        return self


class AtifStep(_Atif):
    step_id: int = Field(ge=1)
    timestamp: str | None = None  # ISO 8601
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str
    reasoning_content: str | None = None
    tool_calls: list[AtifToolCall] | None = None
    observation: AtifObservation | None = None
    metrics: AtifMetrics | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _agent_fields_on_agent_steps(self) -> AtifStep:
        if self.source != "agent":
            agent_only = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
            present = [name for name in agent_only if getattr(self, name) is not None]
            if present:
                raise ValueError(f"step {self.step_id} ({self.source}): {', '.join(present)} belong to agent steps")
        calls = {call.tool_call_id for call in self.tool_calls or []}
        for result in self.observation.results if self.observation else []:
            if result.source_call_id is not None and self.tool_calls is not None and result.source_call_id not in calls:
                raise ValueError(f"step {self.step_id}: observation of unknown tool call {result.source_call_id!r}")
        return self


class AtifFinalMetrics(_Atif):
    total_prompt_tokens: int | None = Field(None, ge=0)
    total_completion_tokens: int | None = Field(None, ge=0)
    total_cached_tokens: int | None = Field(None, ge=0)
    total_cost_usd: float | None = Field(None, ge=0)
    total_steps: int | None = Field(None, ge=0)
    extra: dict[str, Any] | None = None


class AtifTrajectory(_Atif):
    schema_version: str = Field(pattern=r"^ATIF-v1\.[0-4]$")  # the versions these models were written from
    session_id: str
    agent: AtifAgent
    steps: list[AtifStep]
    notes: str | None = None
    final_metrics: AtifFinalMetrics | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _steps_in_order(self) -> AtifTrajectory:
        ids = [step.step_id for step in self.steps]
        if ids != list(range(1, len(ids) + 1)):
            raise ValueError(f"step_id must count 1, 2, ... in order; got {ids[:10]}")
        return self


def _text(messages: list[dict[str, Any]], index: int) -> str:
    return str(messages[index]["content"]) if 0 <= index < len(messages) else ""


def to_atif(record: dict[str, Any]) -> AtifTrajectory:
    """The ATIF document of one trajectory, given as its JSON form (``trajectory_to_json``, decoded)."""
    prompt: list[int] = list(record.get("prompt_ids") or [])
    response: list[int] = list(record.get("response_ids") or [])
    lmask: list[int] = list(record.get("loss_mask") or [])
    lps: list[float] = list(record.get("response_logprobs") or [])
    turns: list[dict[str, Any]] = list(record.get("turns") or [])
    messages: list[dict[str, Any]] = list(record.get("messages") or [])
    steps: list[AtifStep] = []
    head = [m for m in messages[:2] if m.get("role") in ("system", "user")]
    for m in head:
        steps.append(AtifStep(step_id=len(steps) + 1, source=m["role"], message=str(m["content"])))
    if not head:  # no readable messages: the prompt's tokens say it all
        steps.append(AtifStep(step_id=1, source="user", message=""))
    for i, turn in enumerate(turns):
        start, n = int(turn["response_offset"]), int(turn["response_tokens"])
        end = int(turns[i + 1]["response_offset"]) if i + 1 < len(turns) else len(response)
        extra: dict[str, Any] = {"turn": {k: v for k, v in turn.items() if k not in ("index", "response_offset",
                                                                                     "response_tokens")},
                                 "observation_token_ids": response[start + n:end]}  # fmt: skip
        if lmask[start:end] != [1] * n + [0] * (end - start - n) or any(lps[start + n : end]):
            extra["loss_mask"], extra["region_logprobs"] = lmask[start:end], lps[start:end]  # kept as recorded
        observation = _text(messages, len(head) + 2 * i + 1)
        steps.append(AtifStep(
            step_id=len(steps) + 1, source="agent", message=_text(messages, len(head) + 2 * i),
            observation=AtifObservation(results=[AtifObservationResult(content=observation)]) if observation else None,
            metrics=AtifMetrics(
                prompt_tokens=int(turn["prompt_tokens"]), completion_tokens=n, cached_tokens=int(turn["cached_tokens"]),
                prompt_token_ids=prompt + response[:start], completion_token_ids=response[start : start + n],
                logprobs=lps[start : start + n],
            ),
            extra=extra,
        ))  # fmt: skip
    rest = {k: v for k, v in record.items() if k not in (*_TOKEN_FIELDS, "turns", "messages")}
    if not turns:  # nothing generated: the tokens and messages stay with the record
        rest.update({k: record.get(k) or [] for k in _TOKEN_FIELDS}, messages=record.get("messages"))
    agent = record.get("agent") or {}
    return AtifTrajectory(
        schema_version=ATIF_VERSION,
        session_id=f"{record['trajectory_id']}#{record['attempt']}",
        agent=AtifAgent(name=AGENT_NAME, version="1", extra={"kind": agent.get("kind", "bash")}),
        steps=steps,
        final_metrics=AtifFinalMetrics(
            total_prompt_tokens=sum(int(t["prompt_tokens"]) for t in turns),
            total_completion_tokens=sum(int(t["response_tokens"]) for t in turns),
            total_cached_tokens=sum(int(t["cached_tokens"]) for t in turns),
            total_steps=len(steps),
            extra={"reward": record.get("reward"), "status": record.get("status")},
        ),  # fmt: skip
        extra={"rollout": rest},
    )


def from_atif(doc: AtifTrajectory) -> dict[str, Any]:
    """The trajectory's JSON form (for ``trajectory_from_json``) rebuilt from a document made by :func:`to_atif`."""
    rest = (doc.extra or {}).get("rollout")
    if not isinstance(rest, dict):
        raise ValueError(f"{doc.session_id}: not a rollout-platform trajectory (no extra.rollout)")
    record: dict[str, Any] = dict(rest)
    agent_steps = [s for s in doc.steps if s.source == "agent"]
    if not agent_steps:
        return record
    head = [s for s in doc.steps if s.source != "agent"]
    first = agent_steps[0].metrics
    prompt = list(first.prompt_token_ids or []) if first else []
    response: list[int] = []
    lmask: list[int] = []
    lps: list[float] = []
    turns: list[dict[str, Any]] = []
    messages = [{"role": s.source, "content": s.message} for s in head]
    for index, step in enumerate(agent_steps):
        metrics, extra = step.metrics or AtifMetrics(), step.extra or {}
        ids, logps = list(metrics.completion_token_ids or []), list(metrics.logprobs or [])
        if len(ids) != len(logps):
            raise ValueError(f"step {step.step_id}: {len(ids)} completion token ids but {len(logps)} logprobs")
        if metrics.prompt_token_ids is not None and metrics.prompt_token_ids != prompt + response:
            raise ValueError(f"step {step.step_id}: its prompt does not extend the previous turn's tokens")
        observed = list(extra.get("observation_token_ids") or [])
        turns.append({**extra.get("turn", {}), "index": index, "response_offset": len(response),
                      "response_tokens": len(ids)})  # fmt: skip
        response += ids + observed
        lmask += extra.get("loss_mask") or [1] * len(ids) + [0] * len(observed)
        lps += extra.get("region_logprobs") or logps + [0.0] * len(observed)
        messages.append({"role": "assistant", "content": step.message})
        results = step.observation.results if step.observation else []
        if results:
            messages.append({"role": "user", "content": results[0].content or ""})
    record.update(prompt_ids=prompt, response_ids=response, loss_mask=lmask, response_logprobs=lps, turns=turns)
    if any(m["content"] for m in messages):
        record["messages"] = messages
    return record

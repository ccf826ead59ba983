"""One ``/generate`` call with token ids, through the proxy's own data plane.

The gateway hands a native body to the :class:`Forwarder`, so a gateway call gets exactly what
every other call gets: the context guard, the hold during weight updates, session affinity,
retries on another engine, aborts on disconnect or deadline, provenance and metrics.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from services.llm_proxy.calls import NATIVE_DOC, Forwarder
from services.protocol import ErrorCode, PlatformError
from services.protocol import llm as h
from services.protocol.trajectory import RoutedExperts


@dataclass(frozen=True, slots=True)
class EngineRequest:
    pool: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: dict[str, Any]
    affinity: str  # the session id: calls of a session keep their engine (prefix cache)
    deadline_s: float | None
    top_logprobs: int = 0
    stop: list[str] = field(default_factory=list)
    routed_experts: tuple[int, int] | None = None  # (layers, topk) when the pool returns them


@dataclass(frozen=True, slots=True)
class EngineAnswer:
    output_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]  # per output token: (token id, logprob), best first
    finish_reason: str  # stop | length | abort
    weight_version: str
    engine_id: str
    prompt_tokens: int
    cached_tokens: int
    llm_s: float
    routed_experts: RoutedExperts | None


async def generate(forwarder: Forwarder, request: web.Request, req: EngineRequest) -> EngineAnswer:
    params = {k: v for k, v in req.sampling.items() if k != "stop"}
    params.update(max_new_tokens=req.max_new_tokens, skip_special_tokens=False, no_stop_trim=True)
    stops = [*(req.sampling.get("stop") or []), *req.stop]
    if stops:
        params["stop"] = stops
    body: dict[str, Any] = {
        "input_ids": req.prompt_ids,
        "sampling_params": params,
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": req.top_logprobs,
    }
    if req.routed_experts is not None:
        body["return_routed_experts"] = True
    started = time.perf_counter()
    call = forwarder.native_call(req.pool, body, len(req.prompt_ids), req.affinity, req.deadline_s)
    response = await forwarder.send(request, call)
    doc = response.get(NATIVE_DOC)  # a 200 answer: the forwarder's decoded document
    if doc is None:
        assert isinstance(response, web.Response) and isinstance(response.body, bytes)
        doc = orjson.loads(response.body)
    if response.status != 200:
        raise _error(doc, response.status)
    return _answer(doc, response.headers, time.perf_counter() - started, req.routed_experts)


def _error(doc: Any, status: int) -> PlatformError:
    detail = doc.get("error", {}) if isinstance(doc, dict) else {}
    try:
        code = ErrorCode(str(detail.get("code")))
    except ValueError:
        code = ErrorCode.ENGINE_ERROR
    return PlatformError(code, str(detail.get("message", doc)), retry_after_s=detail.get("retry_after_s"))


def _answer(doc: dict[str, Any], headers: Any, llm_s: float, shape: tuple[int, int] | None) -> EngineAnswer:
    meta = doc.get("meta_info") or {}
    output = [int(t) for t in doc.get("output_ids") or []]
    entries = meta.get("output_token_logprobs") or []
    logprobs = [float(e[0]) if e[0] is not None else 0.0 for e in entries][: len(output)]
    logprobs += [0.0] * (len(output) - len(logprobs))
    reason = meta.get("finish_reason")
    finish = str(reason.get("type") if isinstance(reason, dict) else reason or "stop")
    top = [[(int(t[1]), float(t[0])) for t in pos or []] for pos in meta.get("output_top_logprobs") or []]
    return EngineAnswer(
        output_ids=output,
        logprobs=logprobs,
        top_logprobs=top,
        finish_reason=finish,
        weight_version=str(meta.get("weight_version") or headers.get(h.HEADER_WEIGHT_VERSION) or ""),
        engine_id=str(meta.get(h.META_ENGINE) or headers.get(h.HEADER_ENGINE) or ""),
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        llm_s=llm_s,
        routed_experts=_experts(meta.get("routed_experts"), shape),
    )


def _experts(raw: Any, shape: tuple[int, int] | None) -> RoutedExperts | None:
    if shape is None or not isinstance(raw, str):
        return None
    return RoutedExperts(data=base64.b64decode(raw), layers=shape[0], topk=shape[1])

"""HTTP client of the LLM proxy (SGLang ``/generate``), over the lean keep-alive client of
``services.runtime.http_client`` (one call per agent turn; aiohttp's client cost four to eight times
its CPU per call). The gateway agents' calls go over the shared aiohttp session.

A refusal because of the context cap is :class:`ContextExceeded` (the policy's); every other
failure is an ``InfraError`` (the platform's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from services.protocol import ErrorCode, InfraStage, SamplingParams
from services.protocol.llm import HEADER_DEADLINE, HEADER_JOB, HEADER_POOL, HEADER_SESSION, META_ENGINE
from services.rollout_api.worker.clients import InfraError, bearer, error_code, held, parse_json
from services.rollout_api.worker.outages import PROXY, Outages, Unreachable
from services.runtime.http_client import ConnectFailed, Disconnected, HttpClient


class ContextExceeded(Exception):
    """The proxy refused the call: the context would pass the engine's limit."""


@dataclass(frozen=True, slots=True)
class Generation:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: str
    engine_id: str
    prompt_tokens: int
    cached_tokens: int = 0


MAX_RETRY_AFTER_S = 30.0  # one wait at most this long, whatever the answer asks


def retry_after_s(code: ErrorCode, body: Any, headers: Mapping[str, str]) -> float | None:
    """How long to wait before sending a refused call again: only for the proxy's overload answers
    (``capacity_exhausted``, ``rate_limited``) that say when (``Retry-After`` or ``retry_after_s``)."""
    if code not in (ErrorCode.CAPACITY_EXHAUSTED, ErrorCode.RATE_LIMITED):
        return None
    raw: Any = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if raw is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
        raw = body["error"].get("retry_after_s")
    try:
        wait = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    if wait is None or not (wait >= 0):  # also NaN
        return None
    return min(wait, MAX_RETRY_AFTER_S)


def _finish_reason(meta: dict[str, Any]) -> str:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):  # SGLang: {"type": "stop" | "length" | "abort", ...}
        reason = reason.get("type")
    return str(reason or "stop")


def parse_generation(body: dict[str, Any], headers: Mapping[str, str]) -> Generation:
    meta = body.get("meta_info") or {}
    headers = {k.lower(): v for k, v in headers.items()}
    output_ids = [int(t) for t in body.get("output_ids") or []]
    logprobs = [float(entry[0]) for entry in meta.get("output_token_logprobs") or []]
    if len(logprobs) != len(output_ids):
        logprobs = (logprobs + [0.0] * len(output_ids))[: len(output_ids)]
    return Generation(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=_finish_reason(meta),
        weight_version=str(meta.get("weight_version") or headers.get("x-weight-version") or ""),
        engine_id=str(meta.get(META_ENGINE) or headers.get("x-engine-id") or ""),
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
    )


def sampling_params(sampling: SamplingParams) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for a work item (an empty ``stop`` is left out)."""
    params = sampling.model_dump(exclude_defaults=False)
    if not params.get("stop"):
        params.pop("stop", None)
    return params


@dataclass
class ProxyClient:
    session: aiohttp.ClientSession  # the gateway agents' calls; ``/generate`` goes over ``http``
    url: str
    timeout_s: float
    outages: Outages | None = None  # None: an unreachable proxy is an infra error at once
    token: str = ""  # the proxy's service token
    on_wait: Callable[[float], None] | None = None  # told each Retry-After wait (metrics)
    capacity_waits: int = 0  # calls sent again after a 503 capacity_exhausted / 429 with Retry-After
    http: HttpClient = field(init=False)  # the lean client of the hot call

    def __post_init__(self) -> None:
        self.http = HttpClient(self.url)

    async def close(self) -> None:
        await self.http.close()

    async def generate(
        self,
        input_ids: list[int] | bytes,
        sampling: SamplingParams | dict[str, Any],
        max_new_tokens: int,
        *,
        pool: str,
        session_id: str,
        job: str = "",
    ) -> Generation:
        """One ``/generate``. ``input_ids`` may come JSON-encoded (``TokenBuffer.context_json``) and
        ``sampling`` as :func:`sampling_params` (both once per episode, not once per turn)."""
        params = dict(sampling_params(sampling) if isinstance(sampling, SamplingParams) else sampling)
        params["max_new_tokens"] = max_new_tokens
        ids = input_ids if isinstance(input_ids, bytes) else orjson.dumps(input_ids)
        rest = orjson.dumps({"sampling_params": params, "return_logprob": True})
        headers = {
            HEADER_POOL: pool, HEADER_SESSION: session_id, HEADER_DEADLINE: f"{self.timeout_s:g}",
            "Content-Type": "application/json", **bearer(self.token), **({HEADER_JOB: job} if job else {}),
        }  # fmt: skip
        data = b'{"input_ids":' + ids + b"," + rest[1:]
        give_up_at = time.monotonic() + self.timeout_s
        while True:
            status, body, answer_headers = await held(
                self.outages, PROXY, InfraStage.LLM, lambda: self._post(data, headers)
            )
            if status == 200 and isinstance(body, dict):
                return parse_generation(body, answer_headers)
            code = error_code(body, ErrorCode.ENGINE_ERROR)
            wait = retry_after_s(code, body, answer_headers)
            if wait is None or time.monotonic() + wait > give_up_at:
                break
            # the proxy's queue is full (or the job is over its rate): generating has no side effect,
            # so the call waits as told and is sent again, within the call's own timeout
            self.capacity_waits += 1
            if self.on_wait is not None:
                self.on_wait(wait)
            await asyncio.sleep(wait)
        if code is ErrorCode.CONTEXT_LENGTH_EXCEEDED:
            raise ContextExceeded(str(body))
        stage = InfraStage.LLM_TIMEOUT if code is ErrorCode.UPSTREAM_TIMEOUT else InfraStage.LLM
        raise InfraError(stage, code, f"proxy answered {status}: {str(body)[:300]}")

    async def _post(self, data: bytes, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        """One ``/generate``; a call the proxy never answered (refused, or the proxy died) is
        :class:`Unreachable`: generating is free of side effects, so it is sent again."""
        try:
            answer = await self.http.request("POST", "/generate", data, headers, self.timeout_s + 5.0)
        except TimeoutError as exc:
            raise InfraError(InfraStage.LLM_TIMEOUT, ErrorCode.UPSTREAM_TIMEOUT, "LLM call timed out") from exc
        except (ConnectFailed, Disconnected) as exc:
            raise Unreachable(f"proxy: {exc!r}") from exc
        return answer.status, parse_json(answer.body), answer.headers

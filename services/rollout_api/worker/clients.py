"""HTTP clients of the LLM proxy (SGLang ``/generate``) and the sandbox broker, over aiohttp.

Every failure becomes a typed exception: :class:`ContextExceeded` is the policy's (a cap),
:class:`InfraError` the platform's (retried in a fresh sandbox, never scored).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from services.protocol import ErrorCode, InfraStage, SamplingParams
from services.protocol.llm import HEADER_DEADLINE, HEADER_JOB, HEADER_POOL, HEADER_SESSION, META_ENGINE
from services.protocol.sandboxes import ExecRequest, ExecResult, Lease, LeaseRequest

log = logging.getLogger(__name__)


class InfraError(Exception):
    """The platform failed the attempt at ``stage``; ``retryable`` is False for request errors."""

    def __init__(self, stage: InfraStage, code: ErrorCode, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{stage.value}/{code}: {message}")
        self.stage = stage
        self.code = code
        self.message = message
        self.retryable = retryable


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


def _error_code(body: Any, otherwise: ErrorCode) -> ErrorCode:
    """The platform code of an error answer; ``otherwise`` when it carries none (or an unknown one)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        try:
            return ErrorCode(body["error"].get("code"))
        except ValueError:
            pass
    return otherwise


async def _json_body(response: aiohttp.ClientResponse) -> Any:
    raw = await response.read()
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return {"raw": raw[:500].decode(errors="replace")}


def _finish_reason(meta: dict[str, Any]) -> str:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):  # SGLang: {"type": "stop" | "length" | "abort", ...}
        reason = reason.get("type")
    return str(reason or "stop")


def parse_generation(body: dict[str, Any], headers: dict[str, str]) -> Generation:
    meta = body.get("meta_info") or {}
    output_ids = [int(t) for t in body.get("output_ids") or []]
    logprobs = [float(entry[0]) for entry in meta.get("output_token_logprobs") or []]
    if len(logprobs) != len(output_ids):
        logprobs = (logprobs + [0.0] * len(output_ids))[: len(output_ids)]
    return Generation(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=_finish_reason(meta),
        weight_version=str(meta.get("weight_version") or headers.get("X-Weight-Version") or ""),
        engine_id=str(meta.get(META_ENGINE) or headers.get("X-Engine-Id") or ""),
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
    )


@dataclass
class ProxyClient:
    session: aiohttp.ClientSession
    url: str
    timeout_s: float
    token: str = ""  # the proxy's service token

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        max_new_tokens: int,
        *,
        pool: str,
        session_id: str,
        job: str = "",
    ) -> Generation:
        params = sampling.model_dump(exclude_defaults=False)
        if not params.get("stop"):
            params.pop("stop", None)
        params["max_new_tokens"] = max_new_tokens
        payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
        headers = {
            HEADER_POOL: pool, HEADER_SESSION: session_id, HEADER_DEADLINE: f"{self.timeout_s:g}",
            "Content-Type": "application/json", **_bearer(self.token), **({HEADER_JOB: job} if job else {}),
        }  # fmt: skip
        try:
            async with self.session.post(
                f"{self.url}/generate", data=orjson.dumps(payload), headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s + 5.0),
            ) as response:  # fmt: skip
                body = await _json_body(response)
                if response.status == 200 and isinstance(body, dict):
                    return parse_generation(body, dict(response.headers))
        except TimeoutError as exc:
            raise InfraError(InfraStage.LLM_TIMEOUT, ErrorCode.UPSTREAM_TIMEOUT, "LLM call timed out") from exc
        except aiohttp.ClientError as exc:
            raise InfraError(InfraStage.LLM, ErrorCode.TRANSPORT_ERROR, f"proxy unreachable: {exc!r}") from exc
        code = _error_code(body, ErrorCode.ENGINE_ERROR)
        if code is ErrorCode.CONTEXT_LENGTH_EXCEEDED:
            raise ContextExceeded(str(body))
        stage = InfraStage.LLM_TIMEOUT if code is ErrorCode.UPSTREAM_TIMEOUT else InfraStage.LLM
        raise InfraError(stage, code, f"proxy answered {response.status}: {str(body)[:300]}")


@dataclass
class BrokerClient:
    session: aiohttp.ClientSession
    url: str
    overhead_s: float  # HTTP time allowed beyond a command's own timeout
    token: str = ""  # the broker's service token
    _timeout: aiohttp.ClientTimeout = field(init=False)
    _headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self._timeout = aiohttp.ClientTimeout(total=self.overhead_s)
        self._headers = _bearer(self.token)

    async def _call(
        self, stage: InfraStage, method: str, path: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else self._timeout
        try:
            async with self.session.request(
                method, f"{self.url}{path}", timeout=timeout, headers=self._headers, **kwargs
            ) as response:
                body = await _json_body(response)
                if response.status < 300:
                    return body
        except TimeoutError as exc:
            raise InfraError(stage, ErrorCode.UPSTREAM_TIMEOUT, f"broker {method} {path} timed out") from exc
        except aiohttp.ClientError as exc:
            raise InfraError(InfraStage.BROKER, ErrorCode.TRANSPORT_ERROR, f"broker unreachable: {exc!r}") from exc
        code = _error_code(body, ErrorCode.INTERNAL_ERROR)
        message = f"broker {method} {path} answered {response.status}: {str(body)[:300]}"
        # a lease that ended (its sandbox reaped, the broker restarted) is retried with a new one
        raise InfraError(stage, code, message, retryable=code.infra or code is ErrorCode.LEASE_NOT_FOUND)

    async def lease(self, request: LeaseRequest) -> Lease:
        body = await self._call(
            InfraStage.SANDBOX_CREATE, "POST", "/leases", json=request.model_dump(mode="json"),
            timeout_s=request.wait_s + self.overhead_s,
        )  # fmt: skip
        return Lease.model_validate(body)

    async def renew(self, lease_id: str, ttl_s: float) -> None:
        await self._call(InfraStage.SANDBOX_EXEC, "POST", f"/leases/{lease_id}/renew", json={"ttl_s": ttl_s})

    async def release(self, lease_id: str) -> None:
        await self._call(InfraStage.SANDBOX_EXEC, "DELETE", f"/leases/{lease_id}")

    async def exec(
        self, lease_id: str, request: ExecRequest, stage: InfraStage = InfraStage.SANDBOX_EXEC
    ) -> ExecResult:
        body = await self._call(
            stage, "POST", f"/leases/{lease_id}/exec", json=request.model_dump(mode="json", exclude_none=True),
            timeout_s=request.timeout_s + self.overhead_s,
        )  # fmt: skip
        return ExecResult.model_validate(body)

    async def write_file(self, lease_id: str, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        await self._call(InfraStage.SANDBOX_EXEC, "PUT", f"/leases/{lease_id}/files", params={"path": path}, data=data)

    async def read_file(self, lease_id: str, path: str) -> bytes | None:
        """The file's bytes; None when there is no such file (or it is a directory)."""
        url = f"{self.url}/leases/{lease_id}/files"
        try:
            async with self.session.get(url, params={"path": path}, timeout=self._timeout) as response:
                raw = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise InfraError(InfraStage.BROKER, ErrorCode.TRANSPORT_ERROR, f"broker unreachable: {exc!r}") from exc
        if response.status == 200:
            return raw
        if response.status in (400, 404):
            return None
        raise InfraError(InfraStage.SANDBOX_EXEC, ErrorCode.INTERNAL_ERROR, f"reading {path}: {raw[:300]!r}")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def new_session() -> aiohttp.ClientSession:
    """No connection cap (aiohttp's default of 100 is the classic hidden cap); idle < 5 s keep-alive."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    return aiohttp.ClientSession(connector=connector)


async def release_quietly(broker: BrokerClient, lease_id: str) -> None:
    """Release a lease even while the caller is being cancelled; a failure leaves it to the broker's TTL."""
    try:
        await asyncio.shield(broker.release(lease_id))
    except InfraError as exc:
        log.warning("release of lease %s failed (its TTL will reap it): %s", lease_id, exc)

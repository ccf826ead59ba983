"""HTTP clients of the LLM proxy (SGLang ``/generate``) and the sandbox broker, over the lean
keep-alive client of ``services.runtime.http_client`` (two calls per agent turn; aiohttp's client
cost four to eight times its CPU per call).

Every failure becomes a typed exception: :class:`ContextExceeded` is the policy's (a cap),
:class:`InfraError` the platform's (retried in a fresh sandbox, never scored).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode

import aiohttp
import orjson

from services.protocol import ErrorCode, InfraStage, SamplingParams
from services.protocol.llm import HEADER_DEADLINE, HEADER_JOB, HEADER_POOL, HEADER_SESSION, META_ENGINE
from services.protocol.sandboxes import MAX_RENEWALS, ExecRequest, ExecResult, Lease, LeaseRequest, RenewedLeases
from services.rollout_api.worker.outages import BROKER, PROXY, Outages, Unreachable
from services.runtime.http_client import Answer, ConnectFailed, Disconnected, HttpClient

log = logging.getLogger(__name__)
T = TypeVar("T")
JSON_HEADERS = {"Content-Type": "application/json"}


class InfraError(Exception):
    """The platform failed the attempt at ``stage``; ``retryable`` is False for request errors."""

    def __init__(self, stage: InfraStage, code: ErrorCode, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{stage.value}/{code}: {message}")
        self.stage = stage
        self.code = code
        self.message = message
        self.retryable = retryable

    def at(self, stage: InfraStage, context: str) -> InfraError:
        """The same failure seen at ``stage``: its code and ``retryable`` kept, ``context`` prefixed."""
        return InfraError(stage, self.code, f"{context}: {self.message}", retryable=self.retryable)


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


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return {"raw": raw[:500].decode(errors="replace")}


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
            "Content-Type": "application/json", **_bearer(self.token), **({HEADER_JOB: job} if job else {}),
        }  # fmt: skip
        data = b'{"input_ids":' + ids + b"," + rest[1:]
        give_up_at = time.monotonic() + self.timeout_s
        while True:
            status, body, answer_headers = await held(
                self.outages, PROXY, InfraStage.LLM, lambda: self._post(data, headers)
            )
            if status == 200 and isinstance(body, dict):
                return parse_generation(body, answer_headers)
            code = _error_code(body, ErrorCode.ENGINE_ERROR)
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
        return answer.status, _json(answer.body), answer.headers


@dataclass
class BrokerClient:
    session: aiohttp.ClientSession  # kept for callers that share it; the broker's calls go over ``http``
    url: str
    overhead_s: float  # HTTP time allowed beyond a command's own timeout
    outages: Outages | None = None  # None: an unreachable broker is an infra error at once
    releasing: set[asyncio.Future[None]] = field(default_factory=set)  # releases in flight (kept referenced)
    token: str = ""  # the broker's service token
    http: HttpClient = field(init=False)
    _headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.http = HttpClient(self.url)
        self._headers = _bearer(self.token)

    async def close(self) -> None:
        await self.http.close()

    async def _call(
        self, stage: InfraStage, method: str, path: str, *, timeout_s: float | None = None, body: Any = None,
        data: bytes | None = None,
    ) -> Any:  # fmt: skip
        """``body`` is sent as JSON, ``data`` as it is; the answer's JSON comes back."""
        payload, headers = data or b"", self._headers
        if body is not None:
            payload, headers = orjson.dumps(body), {**self._headers, **JSON_HEADERS}
        limit = timeout_s or self.overhead_s

        async def send() -> tuple[int, Any]:
            answer = await self._send(stage, method, path, limit, payload, headers)
            return answer.status, _json(answer.body)

        status, body = await held(self.outages, BROKER, InfraStage.BROKER, send)
        if status < 300:
            return body
        code = _error_code(body, ErrorCode.INTERNAL_ERROR)
        message = f"broker {method} {path} answered {status}: {str(body)[:300]}"
        # a lease that ended (its sandbox reaped, the broker restarted) is retried with a new one
        raise InfraError(stage, code, message, retryable=code.infra or code is ErrorCode.LEASE_NOT_FOUND)

    async def _send(
        self, stage: InfraStage, method: str, path: str, limit_s: float, payload: bytes, headers: dict[str, str]
    ) -> Answer:
        """A request that never reached the broker is :class:`Unreachable` (sent again after the
        outage); one cut off after it was sent trips the breaker and fails this attempt (a command
        may have run), which the runner then repeats without spending an attempt."""
        try:
            return await self.http.request(method, path, payload, headers, limit_s)
        except TimeoutError as exc:
            raise InfraError(stage, ErrorCode.UPSTREAM_TIMEOUT, f"broker {method} {path} timed out") from exc
        except ConnectFailed as exc:
            raise Unreachable(f"broker: {exc!r}") from exc
        except Disconnected as exc:
            if self.outages is not None:
                self.outages.breakers[BROKER].trip(repr(exc))
            raise InfraError(InfraStage.BROKER, ErrorCode.TRANSPORT_ERROR, f"broker connection lost: {exc!r}") from exc

    async def lease(self, request: LeaseRequest) -> Lease:
        body = await self._call(
            InfraStage.SANDBOX_CREATE, "POST", "/leases", body=request.model_dump(mode="json"),
            timeout_s=request.wait_s + self.overhead_s + _setup_budget_s(request),
        )  # fmt: skip
        return Lease.model_validate(body)

    async def renew(self, lease_id: str, ttl_s: float) -> None:
        await self._call(InfraStage.SANDBOX_EXEC, "POST", f"/leases/{lease_id}/renew", body={"ttl_s": ttl_s})

    async def renew_many(self, lease_ids: list[str], ttl_s: float) -> list[str]:
        """Renew many leases with one call per ``MAX_RENEWALS``; the ids that were not renewed (ended).
        A broker without the route (405/404: one not upgraded yet) gets a call per lease."""
        ended: list[str] = []
        for start in range(0, len(lease_ids), MAX_RENEWALS):
            ids = lease_ids[start : start + MAX_RENEWALS]
            try:
                body = await self._call(
                    InfraStage.SANDBOX_EXEC, "POST", "/leases/renew", body={"ids": ids, "ttl_s": ttl_s}
                )
            except InfraError as exc:
                if exc.code not in (ErrorCode.BAD_REQUEST, ErrorCode.NOT_FOUND):
                    raise
                ended += await self._renew_each(ids, ttl_s)
                continue
            ended += RenewedLeases.model_validate(body).ended
        return ended

    async def _renew_each(self, lease_ids: list[str], ttl_s: float) -> list[str]:
        """A renewal per lease; the ones the broker says ended (404 ``lease_not_found``). Any other
        failure (the broker busy, a connection cut) is raised, not reported as an ended lease."""
        done = await asyncio.gather(*(self.renew(i, ttl_s) for i in lease_ids), return_exceptions=True)
        ended = [i for i, outcome in zip(lease_ids, done, strict=True) if _lease_ended(outcome)]
        for outcome in done:
            if isinstance(outcome, BaseException) and not _lease_ended(outcome):
                raise outcome
        return ended

    async def release(self, lease_id: str) -> None:
        await self._call(InfraStage.SANDBOX_EXEC, "DELETE", f"/leases/{lease_id}")

    async def exec(
        self, lease_id: str, request: ExecRequest, stage: InfraStage = InfraStage.SANDBOX_EXEC
    ) -> ExecResult:
        body = await self._call(
            stage, "POST", f"/leases/{lease_id}/exec", body=request.model_dump(mode="json", exclude_none=True),
            timeout_s=request.timeout_s + self.overhead_s,
        )  # fmt: skip
        return ExecResult.model_validate(body)

    async def bind_gateway(self, lease_id: str, session: str, upstream: str, ttl_s: float,
                           task_lease: str | None = None) -> None:  # fmt: skip
        """Have the broker forward the session (and nothing else) into the lease's sandbox; with
        ``task_lease`` (a paired agent's sandbox), also that lease's exec and files, to this broker."""
        body: dict[str, object] = {"session": session, "upstream": upstream, "ttl_s": ttl_s}
        if task_lease is not None:
            body.update(task_lease=task_lease, broker=self.url)
        await self._call(InfraStage.SANDBOX_EXEC, "POST", f"/leases/{lease_id}/gateway", body=body)

    async def write_file(self, lease_id: str, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        await self._call(InfraStage.SANDBOX_EXEC, "PUT", _files(lease_id, path), data=data)

    async def read_file(self, lease_id: str, path: str) -> bytes | None:
        """The file's bytes; None when there is no such file (or it is a directory)."""
        try:
            answer = await self.http.request("GET", _files(lease_id, path), b"", self._headers, self.overhead_s)
        except (TimeoutError, ConnectionError) as exc:
            raise InfraError(InfraStage.BROKER, ErrorCode.TRANSPORT_ERROR, f"broker unreachable: {exc!r}") from exc
        if answer.status == 200:
            return answer.body
        if answer.status in (400, 404):
            return None
        raise InfraError(InfraStage.SANDBOX_EXEC, ErrorCode.INTERNAL_ERROR, f"reading {path}: {answer.body[:300]!r}")

    async def get_archive(self, lease_id: str, directory: str) -> bytes | None:
        """The directory as a tar archive; None when there is no such directory."""
        path = f"/leases/{lease_id}/archive?{urlencode({'path': directory})}"
        try:
            answer = await self.http.request("GET", path, b"", self._headers, self.overhead_s)
        except (TimeoutError, ConnectionError) as exc:
            raise InfraError(InfraStage.BROKER, ErrorCode.TRANSPORT_ERROR, f"broker unreachable: {exc!r}") from exc
        if answer.status == 200:
            return answer.body
        if answer.status in (400, 404):
            return None
        message = f"packing {directory}: {answer.body[:300]!r}"
        raise InfraError(InfraStage.SANDBOX_EXEC, ErrorCode.INTERNAL_ERROR, message)

    async def put_archive(self, lease_id: str, directory: str, tar: bytes) -> None:
        """Unpack a tar archive into the directory (made if missing)."""
        path = f"/leases/{lease_id}/archive?{urlencode({'path': directory})}"
        await self._call(InfraStage.SANDBOX_EXEC, "PUT", path, data=tar)


def _lease_ended(outcome: object) -> bool:
    return isinstance(outcome, InfraError) and outcome.code is ErrorCode.LEASE_NOT_FOUND


def _files(lease_id: str, path: str) -> str:
    return f"/leases/{lease_id}/files?{urlencode({'path': path})}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def held(outages: Outages | None, service: str, stage: InfraStage, send: Callable[[], Awaitable[T]]) -> T:
    """``send()`` through the service's breaker; still unreachable (no breaker, or past the outage
    budget): an infra error."""
    try:
        if outages is None:
            return await send()
        return await outages.call(service, send)
    except Unreachable as exc:
        raise InfraError(stage, ErrorCode.TRANSPORT_ERROR, f"{service} unreachable: {exc}") from exc


def new_session() -> aiohttp.ClientSession:
    """No connection cap (aiohttp's default of 100 is the classic hidden cap); idle < 5 s keep-alive."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    return aiohttp.ClientSession(connector=connector)


async def release_quietly(broker: BrokerClient, lease_id: str) -> None:
    """Release a lease even while the caller is being cancelled; a failure leaves it to the broker's TTL.
    While the broker is down the release waits for it in the background (the episode goes on), so a
    restarted broker does not keep a lease its worker already let go."""
    release = asyncio.ensure_future(_release(broker, lease_id))
    broker.releasing.add(release)
    release.add_done_callback(broker.releasing.discard)
    if broker.outages is None or broker.outages.breakers[BROKER].up.is_set():
        await asyncio.shield(release)


async def _release(broker: BrokerClient, lease_id: str) -> None:
    try:
        await broker.release(lease_id)
    except InfraError as exc:
        log.warning("release of lease %s failed (its TTL will reap it): %s", lease_id, exc)


def _setup_budget_s(request: LeaseRequest) -> float:
    """How long the broker may take to run the lease's setup (or wait for its group's first run)."""
    setup = request.setup
    return (1 + len(setup.commands)) * setup.timeout_s if setup is not None else 0.0

"""HTTP client of the sandbox broker, over the lean keep-alive client of
``services.runtime.http_client``. Every failure is an ``InfraError`` at the call's stage; a broker
that cannot be reached holds the call through its breaker (``outages``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson

from services.protocol import ErrorCode, InfraStage
from services.protocol.errors import ErrorDetail
from services.protocol.sandboxes import (
    MAX_RENEWALS,
    ExecRequest,
    ExecResult,
    Lease,
    LeaseBatchResult,
    LeaseRequest,
    RenewedLeases,
)
from services.rollout_api.worker.clients import JSON_HEADERS, InfraError, bearer, error_code, held, parse_json
from services.rollout_api.worker.lease_batches import LeaseBatcher
from services.rollout_api.worker.outages import BROKER, Outages, Unreachable
from services.rollout_api.worker.warm_claims import WarmClaims
from services.runtime.http_client import Answer, ConnectFailed, Disconnected, HttpClient

log = logging.getLogger(__name__)
BATCH_PATH = "/leases/batch"


@dataclass
class BrokerClient:
    session: aiohttp.ClientSession  # kept for callers that share it; the broker's calls go over ``http``
    url: str
    overhead_s: float  # HTTP time allowed beyond a command's own timeout
    outages: Outages | None = None  # None: an unreachable broker is an infra error at once
    releasing: set[asyncio.Future[None]] = field(default_factory=set)  # releases in flight (kept referenced)
    token: str = ""  # the broker's service token
    batch_window_s: float = 0.0  # leases asked for within this long go out together; 0: the same loop turn
    on_batch: Callable[[int], None] | None = None  # told the size of each POST /leases/batch sent (metrics)
    claims: WarmClaims | None = None  # warm sandboxes claimed straight from Redis first (``warm_claims.py``)
    http: HttpClient = field(init=False)
    batcher: LeaseBatcher = field(init=False)  # ``lease`` goes through it (``lease_batches.py``)
    _headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.http = HttpClient(self.url)
        self.batcher = LeaseBatcher(self, self.batch_window_s)
        self._headers = bearer(self.token)

    async def close(self) -> None:
        await self.http.close()
        if self.claims is not None:
            self.claims.close()

    async def _call(
        self, stage: InfraStage, method: str, path: str, *, timeout_s: float | None = None, body: Any = None,
        data: bytes | None = None,
    ) -> Any:  # fmt: skip
        """``body`` is sent as JSON, ``data`` as it is; the answer's JSON comes back."""
        payload, headers = data or b"", self._headers
        if body is not None:
            payload, headers = orjson.dumps(body), {**self._headers, **JSON_HEADERS}
        status, body = await self._exchange(stage, method, path, timeout_s or self.overhead_s, payload, headers)
        if status < 300:
            return body
        raise refused(stage, method, path, status, body)

    async def _exchange(
        self, stage: InfraStage, method: str, path: str, limit_s: float, payload: bytes, headers: dict[str, str]
    ) -> tuple[int, Any]:
        """One request through the broker's breaker (held while it is unreachable): status and JSON."""

        async def send() -> tuple[int, Any]:
            answer = await self._send(stage, method, path, limit_s, payload, headers)
            return answer.status, parse_json(answer.body)

        return await held(self.outages, BROKER, InfraStage.BROKER, send)

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
        """A new lease. Leases asked for at the same moment go out as one ``POST /leases/batch``
        (``lease_batches.py``); each is answered, or raises, as :meth:`lease_one` would."""
        return await self.batcher.lease(request)

    async def lease_one(self, request: LeaseRequest) -> Lease:
        """A new lease on its own request (``POST /leases``)."""
        body = await self._call(
            InfraStage.SANDBOX_CREATE, "POST", "/leases", body=request.model_dump(mode="json"),
            timeout_s=request.wait_s + self.overhead_s + _setup_budget_s(request),
        )  # fmt: skip
        return Lease.model_validate(body)

    async def lease_batch(
        self, requests: list[LeaseRequest], warm_only: bool = False
    ) -> list[Lease | InfraError] | None:
        """Leases in one ``POST /leases/batch``: a lease or the error :meth:`lease_one` would have raised,
        per request, in order (with ``warm_only``: ``warm_miss`` for each one no warm sandbox was ready
        for). None: the broker has no such route (404/405: one not upgraded yet), or, with ``warm_only``,
        refuses the field (422: one older than it). A failure of the whole request is raised."""
        stage = InfraStage.SANDBOX_CREATE
        limit = self.overhead_s + max(r.wait_s + _setup_budget_s(r) for r in requests)
        # each request serialized straight to JSON (a third of the cost of dumping dicts and encoding them)
        leases = b",".join(r.__pydantic_serializer__.to_json(r) for r in requests)
        payload = b'{"leases":[' + leases + (b'],"warm_only":true}' if warm_only else b"]}")
        headers = {**self._headers, **JSON_HEADERS}
        status, body = await self._exchange(stage, "POST", BATCH_PATH, limit, payload, headers)
        if status in (404, 405) or (warm_only and status == 422):
            return None
        if status >= 300:
            raise refused(stage, "POST", BATCH_PATH, status, body)
        results = LeaseBatchResult.model_validate(body).results
        if len(results) != len(requests):
            message = f"broker answered {len(results)} outcomes for {len(requests)} leases"
            raise InfraError(stage, ErrorCode.INTERNAL_ERROR, message)
        return [o.lease if o.lease is not None else _item_error(o.error) for o in results]

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

    def release_later(self, lease_id: str) -> asyncio.Future[None]:
        """Release a lease in the background (kept referenced in ``releasing``); a failure is logged."""
        release = asyncio.ensure_future(_release(self, lease_id))
        self.releasing.add(release)
        release.add_done_callback(self.releasing.discard)
        return release

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


def refused(stage: InfraStage, method: str, path: str, status: int, body: Any) -> InfraError:
    """The error of a call the broker answered with ``status`` >= 300."""
    code = error_code(body, ErrorCode.INTERNAL_ERROR)
    message = f"broker {method} {path} answered {status}: {str(body)[:300]}"
    # a lease that ended (its sandbox reaped, the broker restarted) is retried with a new one; a warm
    # miss is asked again on POST /leases
    retryable = code.infra or code in (ErrorCode.LEASE_NOT_FOUND, ErrorCode.WARM_MISS)
    return InfraError(stage, code, message, retryable=retryable)


def _item_error(error: ErrorDetail | None) -> InfraError:
    """A lease of a batch refused: raised as ``POST /leases`` answering the same error would be."""
    if error is None:
        error = ErrorDetail(code=ErrorCode.INTERNAL_ERROR, message="neither a lease nor an error", infra=True)
    body = {"error": error.model_dump(mode="json", exclude_none=True)}
    return refused(InfraStage.SANDBOX_CREATE, "POST", "/leases", error.code.http_status, body)


async def release_quietly(broker: BrokerClient, lease_id: str) -> None:
    """Release a lease even while the caller is being cancelled; a failure leaves it to the broker's TTL.
    While the broker is down the release waits for it in the background (the episode goes on), so a
    restarted broker does not keep a lease its worker already let go."""
    release = broker.release_later(lease_id)
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

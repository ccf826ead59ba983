"""The routes every agent turn and every heartbeat uses, served as plain ASGI.

``POST /leases``, ``POST /leases/batch`` (many new leases at once), ``DELETE /leases/{id}``,
``POST /leases/{id}/exec``, ``POST /leases/{id}/renew`` and ``POST /leases/renew`` (many leases at once)
are matched by :class:`Front` from the path's segments and answered by one coroutine each, with no
framework between uvicorn and the broker: no routing tables or regular expressions, no ``Request``
object, no middleware or exception-wrapper layers. What the routes do is unchanged: the same wire
format (``services.protocol``), the same checks of the caller (``auth.py``: the same functions the
FastAPI routes use), the same error answers (an exception goes to the app's own handlers,
``install_error_handlers``, looked up as Starlette does) and the same metrics. A request body is
validated straight from its bytes (pydantic's JSON parser) and an answer is serialized once, to bytes.

They are documented in ``/openapi.json`` through :func:`documented`, signatures that are never
mounted: the schema (and the fuzzer, which reads it) sees the routes as FastAPI routes. Served
without :class:`Front`, the app still answers them (:func:`install` mounts them as Starlette routes).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import (
    ExecRequest,
    ExecResult,
    Lease,
    LeaseBatch,
    LeaseBatchResult,
    LeaseOutcome,
    LeaseRenewals,
    LeaseRequest,
    RenewedLeases,
    RenewRequest,
)
from services.protocol.status import ErrorCode
from services.runtime.http_errors import validation_error
from services.sandbox_broker.auth import caller_from, lease_access, own_request, sandbox_access_from
from services.sandbox_broker.broker import Broker

M = TypeVar("M", bound=BaseModel)
JSON = "application/json"
log = logging.getLogger(__name__)
JSON_HEADERS = [(b"content-type", JSON.encode())]
WARM_MISS = "no warm sandbox ready for this lease now: ask POST /leases for it"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes = b""  # JSON; empty: no body (204)


class Call:
    """One request on a hot route: what its handler reads of it."""

    __slots__ = ("lease_id", "receive", "scope", "state")

    def __init__(self, scope: Scope, receive: Receive, state: Any, lease_id: str) -> None:
        self.scope = scope
        self.receive = receive
        self.state = state  # the app's: broker, redis, auth
        self.lease_id = lease_id

    @property
    def broker(self) -> Broker:
        broker: Broker = self.state.broker
        return broker

    def header(self, name: bytes) -> str | None:
        """The first value of a header (``name`` lowercase, as ASGI servers pass them)."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value.decode("latin-1")  # type: ignore[no-any-return]
        return None

    @property
    def authorization(self) -> str | None:
        return self.header(b"authorization")

    async def body(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            message: Message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


Handler = Callable[[Call], Awaitable[Answer]]


async def create_lease(call: Call) -> Answer:
    body = own_request(await caller_from(call.state, call.authorization), await json_body(call, LeaseRequest))
    lease = await call.broker.create_lease(body)
    return Answer(201, _json(lease))


async def create_leases(call: Call) -> Answer:
    """``POST /leases/batch``: each lease as ``POST /leases`` makes it (the same records, tokens, TTLs,
    limits and reaping), all at once; one outcome each. A lease the caller may not ask for refuses
    the whole batch (403) before any is made. With ``warm_only``, each lease only from a warm pool: one
    the warm path cannot serve now is answered ``warm_miss`` at once, so none waits for a create."""
    caller = await caller_from(call.state, call.authorization)
    batch = await json_body(call, LeaseBatch)
    requests = [own_request(caller, request) for request in batch.leases]
    outcomes = await asyncio.gather(*(_one_lease(call.broker, request, batch.warm_only) for request in requests))
    return Answer(200, _json(LeaseBatchResult(results=outcomes)))


async def _one_lease(broker: Broker, request: LeaseRequest, warm_only: bool) -> LeaseOutcome:
    try:
        lease = await broker.warm_lease(request) if warm_only else await broker.create_lease(request)
        if lease is not None:
            return LeaseOutcome(lease=lease)
        broker.metrics.warm_misses.inc()  # not an error: the caller asks POST /leases for it
        return LeaseOutcome(error=PlatformError(ErrorCode.WARM_MISS, WARM_MISS).body().error)
    except PlatformError as exc:
        error = exc.body().error
    except Exception as exc:  # the others' leases are made: answer them, and this one as a 500 would
        log.exception("a lease of a batch failed")
        error = PlatformError(ErrorCode.INTERNAL_ERROR, f"lease failed: {type(exc).__name__}").body().error
    broker.metrics.errors.labels(error.code.value).inc()
    return LeaseOutcome(error=error)


async def release(call: Call) -> Answer:
    broker = call.broker
    lease_id = await lease_access(call.lease_id, await caller_from(call.state, call.authorization), broker)
    await broker.release(lease_id)
    return Answer(204)


async def exec_(call: Call) -> Answer:
    broker = call.broker
    lease_id = await sandbox_access_from(call.lease_id, call.state, call.authorization, broker)
    result = await broker.exec(lease_id, await json_body(call, ExecRequest))
    return Answer(200, _json(result))


async def renew(call: Call) -> Answer:
    broker = call.broker
    lease_id = await lease_access(call.lease_id, await caller_from(call.state, call.authorization), broker)
    body = await json_body(call, RenewRequest)
    return Answer(200, _json(await broker.renew(lease_id, body.ttl_s)))


async def renew_many(call: Call) -> Answer:
    caller = await caller_from(call.state, call.authorization)
    body = await json_body(call, LeaseRenewals)
    renewed = await call.broker.renew_many(body.ids, body.ttl_s, visible=lambda lease: caller.sees_job(lease.job))
    return Answer(200, _json(renewed))


def _json(model: BaseModel) -> bytes:
    return model.__pydantic_serializer__.to_json(model)


def match(method: str, path: str) -> tuple[Handler, str] | None:
    """The hot route of a request and its lease id ("" where the path has none); None: not a hot route.
    A lease id is one non-empty path segment, as Starlette's ``{lease_id}`` matches it."""
    if not path.startswith("/leases"):
        return None
    parts = path.split("/")  # "", "leases", then the id and the action
    if parts[1] != "leases":
        return None
    if len(parts) == 2:
        return (create_lease, "") if method == "POST" else None
    lease_id = parts[2]
    if not lease_id:
        return None
    if len(parts) == 3:
        if method == "DELETE":
            return release, lease_id
        if method != "POST":
            return None
        return {"renew": (renew_many, ""), "batch": (create_leases, "")}.get(lease_id)
    if len(parts) == 4 and method == "POST":
        if parts[3] == "exec":
            return exec_, lease_id
        if parts[3] == "renew":
            return renew, lease_id
    return None


class Front:
    """The broker's ASGI app as served: a request for a hot route goes straight to its handler, its
    exceptions to the app's own exception handlers; every other request, and the lifespan, goes to
    the FastAPI app. What it skips per call is FastAPI's middleware stack (telemetry, body limit,
    two exit stacks, the server-error layer), its router's scan and Starlette's request wrappers."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = match(scope["method"], scope["path"])
            if found is not None:
                await self.serve(found[0], Call(scope, receive, self.app.state, found[1]), send)
                return
        await self.app(scope, receive, send)

    async def serve(self, handler: Handler, call: Call, send: Send) -> None:
        try:
            answer = await handler(call)
        except Exception as exc:
            await self.fail(call, send, exc)
            return
        await _send(send, answer)

    async def fail(self, call: Call, send: Send, exc: Exception) -> None:
        """Answer as Starlette's ``ExceptionMiddleware`` would: the handler of the nearest class in the
        exception's MRO (none: raised on, to the server's 500)."""
        handlers = self.app.exception_handlers
        handler = next((handlers[kind] for kind in type(exc).__mro__ if kind in handlers), None)
        if handler is None:
            raise exc
        call.scope["app"] = self.app  # what ``request.app`` reads
        request = Request(call.scope, call.receive)
        response = handler(request, exc)
        if inspect.isawaitable(response):
            response = await response
        await response(call.scope, call.receive, send)


async def _send(send: Send, answer: Answer) -> None:
    """The answer as Starlette's ``Response`` sends it (no length or type on a 204)."""
    if not answer.body:
        await send({"type": "http.response.start", "status": answer.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-length", str(len(answer.body)).encode()), *JSON_HEADERS]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


async def json_body(call: Call, model: type[M]) -> M:
    """The request's JSON body as ``model``; 422 ``validation_error`` as FastAPI answers it (a body
    that is missing, not declared JSON, not JSON, or not valid, naming the first offending field)."""
    declared = (call.header(b"content-type") or "").split(";", 1)[0].strip().lower()
    if declared != JSON and not (declared.startswith("application/") and declared.endswith("+json")):
        raise PlatformError(ErrorCode.VALIDATION_ERROR, "body: expected a JSON body (content-type application/json)")
    raw = await call.body()
    if not raw:
        raise PlatformError(ErrorCode.VALIDATION_ERROR, "body: Field required")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None


# -- served without the front: the same handlers as Starlette routes -------------------------------


def install(app: FastAPI) -> None:
    """Serve the hot routes ahead of the FastAPI ones (where the app runs without :class:`Front`),
    and document them."""
    app.router.routes[:0] = _routes()
    _document(app)


def _routes() -> list[BaseRoute]:
    return [
        Route("/leases", _endpoint(create_lease), methods=["POST"]),
        Route("/leases/renew", _endpoint(renew_many), methods=["POST"]),
        Route("/leases/batch", _endpoint(create_leases), methods=["POST"]),
        Route("/leases/{lease_id}", _endpoint(release), methods=["DELETE"]),
        Route("/leases/{lease_id}/exec", _endpoint(exec_), methods=["POST"]),
        Route("/leases/{lease_id}/renew", _endpoint(renew), methods=["POST"]),
    ]


def _endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        call = Call(request.scope, request.receive, request.app.state, request.path_params.get("lease_id", ""))
        answer = await handler(call)
        return Response(answer.body or None, status_code=answer.status, media_type=JSON if answer.body else None)

    return endpoint


def _document(app: FastAPI) -> None:
    """``/openapi.json`` with the hot routes in it, as if they were FastAPI routes."""

    def openapi() -> dict[str, object]:
        if app.openapi_schema is None:
            routes = [*app.routes, *documented().routes]
            app.openapi_schema = get_openapi(title=app.title, version=app.version, routes=routes)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def documented() -> APIRouter:
    """The hot routes' signatures for the OpenAPI document only (never mounted: see :func:`install`)."""
    router = APIRouter()

    @router.post("/leases", status_code=201, response_model=Lease)
    async def create_lease(body: LeaseRequest) -> None: ...

    @router.post("/leases/batch", response_model=LeaseBatchResult)
    async def create_leases(body: LeaseBatch) -> None: ...

    @router.post("/leases/renew", response_model=RenewedLeases)
    async def renew_many(body: LeaseRenewals) -> None: ...

    @router.delete("/leases/{lease_id}", status_code=204)
    async def release(lease_id: str) -> None: ...

    @router.post("/leases/{lease_id}/exec", response_model=ExecResult)
    async def exec_(lease_id: str, body: ExecRequest) -> None: ...

    @router.post("/leases/{lease_id}/renew", response_model=Lease)
    async def renew(lease_id: str, body: RenewRequest) -> None: ...

    return router

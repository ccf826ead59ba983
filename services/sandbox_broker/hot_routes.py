"""The three routes every agent turn uses, served without FastAPI's per-request machinery.

``POST /leases``, ``DELETE /leases/{id}`` and ``POST /leases/{id}/exec`` are plain Starlette routes,
placed ahead of the FastAPI ones. FastAPI would, per request, solve the dependency graph, parse the
content type with ``email.message``, decode JSON with the standard library and validate the dict;
here the body is validated straight from its bytes (pydantic's JSON parser) and the answer is
serialized once. What the routes do is unchanged: the same wire format (``services.protocol``), the
same checks of the caller (``auth.py``: the same functions the FastAPI routes use), the same error
answers (exceptions go to the handlers of ``install_error_handlers``) and the same metrics.

They are documented in ``/openapi.json`` through :func:`documented`, signatures that are never
mounted: the schema (and the fuzzer, which reads it) sees the routes as before.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute, Route

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, ExecResult, Lease, LeaseRequest
from services.protocol.status import ErrorCode
from services.runtime.http_errors import validation_error
from services.sandbox_broker.auth import caller_of, lease_access, own_request, sandbox_access
from services.sandbox_broker.broker import Broker

M = TypeVar("M", bound=BaseModel)
JSON = "application/json"


def install(app: FastAPI) -> None:
    """Serve the hot routes ahead of the FastAPI ones, and document them."""
    routes: list[BaseRoute] = [
        Route("/leases", create_lease, methods=["POST"]),
        Route("/leases/{lease_id}", release, methods=["DELETE"]),
        Route("/leases/{lease_id}/exec", exec_, methods=["POST"]),
    ]
    app.router.routes[:0] = routes
    _document(app)


async def create_lease(request: Request) -> Response:
    body = own_request(await caller_of(request), await json_body(request, LeaseRequest))
    lease = await _broker(request).create_lease(body)
    return Response(lease.model_dump_json(), status_code=201, media_type=JSON)


async def release(request: Request) -> Response:
    broker = _broker(request)
    lease_id = await lease_access(request.path_params["lease_id"], await caller_of(request), broker)
    await broker.release(lease_id)
    return Response(status_code=204)


async def exec_(request: Request) -> Response:
    broker = _broker(request)
    lease_id = await sandbox_access(request.path_params["lease_id"], request, broker)
    result = await broker.exec(lease_id, await json_body(request, ExecRequest))
    return Response(result.model_dump_json(), media_type=JSON)


async def json_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as ``model``; 422 ``validation_error`` as FastAPI answers it (a body
    that is missing, not declared JSON, not JSON, or not valid, naming the first offending field)."""
    declared = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if declared != JSON and not (declared.startswith("application/") and declared.endswith("+json")):
        raise PlatformError(ErrorCode.VALIDATION_ERROR, "body: expected a JSON body (content-type application/json)")
    raw = await request.body()
    if not raw:
        raise PlatformError(ErrorCode.VALIDATION_ERROR, "body: Field required")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _broker(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


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

    @router.delete("/leases/{lease_id}", status_code=204)
    async def release(lease_id: str) -> None: ...

    @router.post("/leases/{lease_id}/exec", response_model=ExecResult)
    async def exec_(lease_id: str, body: ExecRequest) -> None: ...

    return router

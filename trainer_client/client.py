"""HTTP client for the rollout API (sync and async), usable on its own with any trainer.

Routes and models are those of :mod:`services.protocol.api`; an error answer raises
:class:`RolloutApiError` carrying the platform's ``ErrorBody`` when there is one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from services.protocol.api import EvalReport, JobCreate, JobCreated, JobStatus, RolloutAccepted, RolloutStatus
from services.protocol.errors import ErrorBody
from services.protocol.tasks import RolloutRequest

M = TypeVar("M", bound=BaseModel)


class RolloutApiError(Exception):
    def __init__(self, status: int, body: ErrorBody | None, text: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body.error.code.value + ': ' + body.error.message if body else text[:300]}")

    @property
    def infra(self) -> bool:
        """True when retrying later may help (an infrastructure failure)."""
        return self.body.error.infra if self.body else self.status >= 500


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: BaseModel | None = None
    token: str | None = None


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _parse(response: httpx.Response, model: type[M]) -> M:
    if response.is_success:
        return model.model_validate_json(response.content)
    try:
        body: ErrorBody | None = ErrorBody.model_validate_json(response.content)
    except ValidationError:
        body = None
    raise RolloutApiError(response.status_code, body, response.text)


def _kwargs(call: _Call, default_token: str | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": _headers(call.token or default_token)}
    if call.body is not None:
        kwargs["content"] = call.body.model_dump_json()
        kwargs["headers"]["Content-Type"] = "application/json"
    return kwargs


class RolloutClient:
    """Synchronous client. ``token`` is the job's token; ``create_job`` takes the admin token."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.token = token
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def create_job(self, job: JobCreate, admin_token: str) -> JobCreated:
        return self._do(_Call("POST", "/jobs", job, admin_token), JobCreated)

    def job(self, job: str) -> JobStatus:
        return self._do(_Call("GET", f"/jobs/{job}"), JobStatus)

    def submit(self, request: RolloutRequest) -> RolloutAccepted:
        return self._do(_Call("POST", "/rollouts", request), RolloutAccepted)

    def rollout(self, rollout_id: str) -> RolloutStatus:
        return self._do(_Call("GET", f"/rollouts/{rollout_id}"), RolloutStatus)

    def cancel(self, rollout_id: str) -> RolloutStatus:
        return self._do(_Call("DELETE", f"/rollouts/{rollout_id}"), RolloutStatus)

    def eval_report(self, rollout_id: str) -> EvalReport:
        """pass@k of an evaluation rollout (``mode="eval"``) over the samples finished so far."""
        return self._do(_Call("GET", f"/rollouts/{rollout_id}/eval"), EvalReport)

    def close(self) -> None:
        self.http.close()

    def _do(self, call: _Call, model: type[M]) -> M:
        return _parse(self.http.request(call.method, call.path, **_kwargs(call, self.token)), model)


class AsyncRolloutClient:
    """The same calls with ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.token = token
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s)

    async def create_job(self, job: JobCreate, admin_token: str) -> JobCreated:
        return await self._do(_Call("POST", "/jobs", job, admin_token), JobCreated)

    async def job(self, job: str) -> JobStatus:
        return await self._do(_Call("GET", f"/jobs/{job}"), JobStatus)

    async def submit(self, request: RolloutRequest) -> RolloutAccepted:
        return await self._do(_Call("POST", "/rollouts", request), RolloutAccepted)

    async def rollout(self, rollout_id: str) -> RolloutStatus:
        return await self._do(_Call("GET", f"/rollouts/{rollout_id}"), RolloutStatus)

    async def cancel(self, rollout_id: str) -> RolloutStatus:
        return await self._do(_Call("DELETE", f"/rollouts/{rollout_id}"), RolloutStatus)

    async def eval_report(self, rollout_id: str) -> EvalReport:
        return await self._do(_Call("GET", f"/rollouts/{rollout_id}/eval"), EvalReport)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _do(self, call: _Call, model: type[M]) -> M:
        return _parse(await self.http.request(call.method, call.path, **_kwargs(call, self.token)), model)

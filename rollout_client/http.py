"""HTTP client of the rollout API, sync (:class:`RolloutClient`) and async (:class:`AsyncRolloutClient`).

Routes and models are those of :mod:`services.protocol.api`. Every call returns the route's
model; an error answer raises the typed error of its code (:mod:`rollout_client.errors`).

- ``create_job`` (admin token) -> ``JobCreated`` (the job's token, shown once);
- ``submit`` (``RolloutRequest``: tasks) and ``submit_swebench`` (``SweBenchRolloutRequest``:
  SWE-bench / SWE-smith rows) -> ``RolloutAccepted``;
- ``rollout`` / ``follow`` / ``wait`` -> ``RolloutStatus``; ``cancel``; ``eval_report`` (pass@k);
- ``job`` -> ``JobStatus``, the job's figures (queue depth, in flight, finished, infra-error rate, tails);
- ``trajectories`` -> the job's finished trajectories over Server-Sent Events, resumable from an
  entry id. This read takes nothing away from anyone (no consumer group); a trainer that must see
  each trajectory exactly once, across crashes, reads with :class:`rollout_client.stream.TrajectoryConsumer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from rollout_client.errors import JobGone, RolloutApiError, api_error
from services.protocol.api import EvalReport, JobCreate, JobCreated, JobStatus, RolloutAccepted, RolloutStatus
from services.protocol.errors import ErrorBody
from services.protocol.status import ErrorCode
from services.protocol.swebench import SweBenchRolloutRequest
from services.protocol.tasks import RolloutRequest
from services.protocol.trajectory import Trajectory, trajectory_from_json

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: BaseModel | None = None
    token: str | None = None


@dataclass(frozen=True)
class StreamedTrajectory:
    """One event of ``GET /jobs/{job}/trajectories``: the stream entry id (resume after it) and the record."""

    entry_id: str
    trajectory: Trajectory


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body: ErrorBody | None = ErrorBody.model_validate_json(response.content)
    except ValidationError:
        body = None
    raise api_error(response.status_code, body, response.text)


def _parse(response: httpx.Response, model: type[M]) -> M:
    _raise_for(response)
    return model.model_validate_json(response.content)


def _kwargs(call: _Call, default_token: str | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": _headers(call.token or default_token)}
    if call.body is not None:
        kwargs["content"] = call.body.model_dump_json()
        kwargs["headers"]["Content-Type"] = "application/json"
    return kwargs


def _sse_params(after: str | None, limit: int | None, mode: str) -> dict[str, Any]:
    params: dict[str, Any] = {"mode": mode}
    if after:
        params["after"] = after
    if limit is not None:
        params["limit"] = limit
    return params


class _SseParser:
    """Server-Sent Events, one line at a time: an event is complete at its blank line."""

    def __init__(self) -> None:
        self.entry_id: str | None = None
        self.event = ""
        self.data: list[str] = []

    def feed(self, line: str) -> StreamedTrajectory | None:
        """The trajectory an event completes; an ``error`` event raises its error (``JobGone`` for
        a job that no longer exists)."""
        if line.startswith("id:"):
            self.entry_id = line[3:].strip()
        elif line.startswith("event:"):
            self.event = line[6:].strip()
        elif line.startswith("data:"):
            self.data.append(line[5:].removeprefix(" "))
        elif not line and self.data:
            text, event, self.data, self.event = "\n".join(self.data), self.event, [], ""
            if event == "error":
                raise _stream_error(text)
            return StreamedTrajectory(self.entry_id or "", trajectory_from_json(text))
        return None


def _stream_error(text: str) -> RolloutApiError:
    try:
        body: ErrorBody | None = ErrorBody.model_validate_json(text)
    except ValidationError:
        body = None
    if body is not None and body.error.code is ErrorCode.UNKNOWN_JOB:
        return JobGone(404, body, text)
    return api_error(500, body, text)


class _Idle:
    """TimeoutError once ``limit_s`` passed without an event (checked on every line, keep-alives included)."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.last = time.monotonic()

    def reset(self) -> None:
        self.last = time.monotonic()

    def check(self) -> None:
        if self.limit_s is not None and time.monotonic() - self.last > self.limit_s:
            raise TimeoutError(f"no trajectory for {self.limit_s} s")


def _finished(status: RolloutStatus) -> bool:
    return status.finished >= status.total


class RolloutClient:
    """Synchronous client. ``token`` is the job's token; ``create_job`` takes the admin token."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.token = token
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_job(self, job: JobCreate, admin_token: str) -> JobCreated:
        return self._do(_Call("POST", "/jobs", job, admin_token), JobCreated)

    def job(self, job: str) -> JobStatus:
        """The job's figures: queue depth, in flight, finished, by status, infra failures, tails."""
        return self._do(_Call("GET", f"/jobs/{job}"), JobStatus)

    def submit(self, request: RolloutRequest) -> RolloutAccepted:
        return self._do(_Call("POST", "/rollouts", request), RolloutAccepted)

    def submit_swebench(self, request: SweBenchRolloutRequest) -> RolloutAccepted:
        return self._do(_Call("POST", "/rollouts/swebench", request), RolloutAccepted)

    def rollout(self, rollout_id: str) -> RolloutStatus:
        return self._do(_Call("GET", f"/rollouts/{rollout_id}"), RolloutStatus)

    def follow(self, rollout_id: str, every_s: float = 0.5) -> Iterator[RolloutStatus]:
        """The rollout's status each time it changes, ending with the one where every sample has finished."""
        last: RolloutStatus | None = None
        while True:
            status = self.rollout(rollout_id)
            if status != last:
                yield status
                last = status
            if _finished(status):
                return
            time.sleep(every_s)

    def wait(self, rollout_id: str, timeout_s: float = 3600.0, every_s: float = 0.5) -> RolloutStatus:
        """Block until every sample of the rollout has finished; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for status in self.follow(rollout_id, every_s):
            if _finished(status):
                return status
            if time.monotonic() > deadline:
                break
        raise TimeoutError(f"rollout {rollout_id} did not finish within {timeout_s} s")

    def cancel(self, rollout_id: str) -> RolloutStatus:
        return self._do(_Call("DELETE", f"/rollouts/{rollout_id}"), RolloutStatus)

    def eval_report(self, rollout_id: str) -> EvalReport:
        """pass@k of an evaluation rollout (``mode="eval"``) over the samples finished so far."""
        return self._do(_Call("GET", f"/rollouts/{rollout_id}/eval"), EvalReport)

    def trajectories(
        self,
        job: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        mode: str = "train",
        idle_timeout_s: float | None = None,
    ) -> Iterator[StreamedTrajectory]:
        """The job's trajectories in stream order, after entry ``after`` (from the first without);
        with ``limit`` the stream ends after that many, else it waits for new ones. With
        ``idle_timeout_s``, TimeoutError when no trajectory came for that long (the server's
        keep-alives let the wait be checked while nothing arrives)."""
        params = _sse_params(after, limit, mode)
        kwargs = _kwargs(_Call("GET", ""), self.token)
        with self.http.stream("GET", f"/jobs/{job}/trajectories", params=params, timeout=None, **kwargs) as response:
            if not response.is_success:
                response.read()
                _raise_for(response)
            parser, idle = _SseParser(), _Idle(idle_timeout_s)
            for line in response.iter_lines():
                event = parser.feed(line)
                if event is not None:
                    idle.reset()
                    yield event
                idle.check()

    def close(self) -> None:
        self.http.close()

    def _do(self, call: _Call, model: type[M]) -> M:
        return _parse(self.http.request(call.method, call.path, **_kwargs(call, self.token)), model)


class AsyncRolloutClient:
    """The same calls with ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.token = token
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s)

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create_job(self, job: JobCreate, admin_token: str) -> JobCreated:
        return await self._do(_Call("POST", "/jobs", job, admin_token), JobCreated)

    async def job(self, job: str) -> JobStatus:
        return await self._do(_Call("GET", f"/jobs/{job}"), JobStatus)

    async def submit(self, request: RolloutRequest) -> RolloutAccepted:
        return await self._do(_Call("POST", "/rollouts", request), RolloutAccepted)

    async def submit_swebench(self, request: SweBenchRolloutRequest) -> RolloutAccepted:
        return await self._do(_Call("POST", "/rollouts/swebench", request), RolloutAccepted)

    async def rollout(self, rollout_id: str) -> RolloutStatus:
        return await self._do(_Call("GET", f"/rollouts/{rollout_id}"), RolloutStatus)

    async def follow(self, rollout_id: str, every_s: float = 0.5) -> AsyncIterator[RolloutStatus]:
        last: RolloutStatus | None = None
        while True:
            status = await self.rollout(rollout_id)
            if status != last:
                yield status
                last = status
            if _finished(status):
                return
            await asyncio.sleep(every_s)

    async def wait(self, rollout_id: str, timeout_s: float = 3600.0, every_s: float = 0.5) -> RolloutStatus:
        deadline = time.monotonic() + timeout_s
        async for status in self.follow(rollout_id, every_s):
            if _finished(status):
                return status
            if time.monotonic() > deadline:
                break
        raise TimeoutError(f"rollout {rollout_id} did not finish within {timeout_s} s")

    async def cancel(self, rollout_id: str) -> RolloutStatus:
        return await self._do(_Call("DELETE", f"/rollouts/{rollout_id}"), RolloutStatus)

    async def eval_report(self, rollout_id: str) -> EvalReport:
        return await self._do(_Call("GET", f"/rollouts/{rollout_id}/eval"), EvalReport)

    async def trajectories(
        self,
        job: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        mode: str = "train",
        idle_timeout_s: float | None = None,
    ) -> AsyncGenerator[StreamedTrajectory, None]:
        params = _sse_params(after, limit, mode)
        kwargs = _kwargs(_Call("GET", ""), self.token)
        async with self.http.stream(
            "GET", f"/jobs/{job}/trajectories", params=params, timeout=None, **kwargs
        ) as response:
            if not response.is_success:
                await response.aread()
                _raise_for(response)
            parser, idle = _SseParser(), _Idle(idle_timeout_s)
            async for line in response.aiter_lines():
                event = parser.feed(line)
                if event is not None:
                    idle.reset()
                    yield event
                idle.check()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _do(self, call: _Call, model: type[M]) -> M:
        return _parse(await self.http.request(call.method, call.path, **_kwargs(call, self.token)), model)

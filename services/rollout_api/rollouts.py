"""``POST /rollouts``, ``POST /rollouts/swebench``, ``GET`` and ``DELETE /rollouts/{id}``, and
``GET /rollouts/{id}/eval``."""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from services.protocol import ErrorCode, PlatformError, RolloutRequest
from services.protocol.api import EvalReport, RolloutAccepted, RolloutStatus
from services.protocol.swebench import SweBenchRolloutRequest
from services.rollout_api.auth import Caller
from services.rollout_api.cancellation import cancel_rollout
from services.rollout_api.context import ApiContext, AuthCaller, Ctx
from services.rollout_api.evaluation import eval_report
from services.rollout_api.jobs import job_or_404
from services.rollout_api.stats import rollout_status
from services.rollout_api.submission import admit, job_of, parse, read_body
from services.rollout_api.swebench import to_rollout_request
from services.runtime.http_errors import validation_error

router = APIRouter()
T = TypeVar("T")


def _accepted(answer: RolloutAccepted) -> JSONResponse:
    return JSONResponse(answer.model_dump(mode="json"), status_code=202)


async def _submit(ctx: ApiContext, caller: Caller, request: RolloutRequest) -> JSONResponse:
    caller.require_job(request.job)
    job = await job_or_404(ctx, request.job)
    return _accepted(await admit(ctx, request, job))


@router.post("/rollouts", status_code=202, response_model=RolloutAccepted)
async def submit_rollout(request: Request, ctx: Ctx, caller: AuthCaller) -> JSONResponse:
    body = await read_body(request, ctx.settings.max_body_bytes)
    return await _submit(ctx, caller, parse(RolloutRequest, body))


@router.post("/rollouts/swebench", status_code=202, response_model=RolloutAccepted)
async def submit_swebench(request: Request, ctx: Ctx, caller: AuthCaller) -> JSONResponse:
    body = await read_body(request, ctx.settings.max_body_bytes)
    swe = parse(SweBenchRolloutRequest, body)
    try:
        converted = to_rollout_request(swe)
    except ValidationError as exc:  # an instance that makes no valid task is the caller's error
        raise validation_error(exc) from None
    return await _submit(ctx, caller, converted)


def _callers_job(caller: Caller, rollout_id: str) -> str:
    """The job of the rollout, which must be the caller's (403 otherwise)."""
    job = job_of(rollout_id)
    caller.require_job(job)
    return job


def _found(value: T | None, rollout_id: str) -> T:
    if value is None:
        raise PlatformError(ErrorCode.NOT_FOUND, f"no rollout {rollout_id!r}")
    return value


async def _status_or_404(ctx: ApiContext, caller: Caller, rollout_id: str) -> RolloutStatus:
    return _found(await rollout_status(ctx.redis, _callers_job(caller, rollout_id), rollout_id), rollout_id)


@router.get("/rollouts/{rollout_id}")
async def get_rollout(rollout_id: str, ctx: Ctx, caller: AuthCaller) -> RolloutStatus:
    return await _status_or_404(ctx, caller, rollout_id)


@router.get("/rollouts/{rollout_id}/eval")
async def get_rollout_eval(rollout_id: str, ctx: Ctx, caller: AuthCaller) -> EvalReport:
    """pass@1 and pass@k of an evaluation rollout (``mode="eval"``) over the samples finished so far."""
    return _found(await eval_report(ctx.redis, _callers_job(caller, rollout_id), rollout_id), rollout_id)


@router.delete("/rollouts/{rollout_id}")
async def delete_rollout(rollout_id: str, ctx: Ctx, caller: AuthCaller) -> RolloutStatus:
    status = await _status_or_404(ctx, caller, rollout_id)
    await cancel_rollout(ctx.redis, ctx.scripts, status.job, rollout_id, maxlen=ctx.settings.trajectory_stream_maxlen)
    return await _status_or_404(ctx, caller, rollout_id)

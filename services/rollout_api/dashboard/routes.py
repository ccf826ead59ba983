"""``/ui``: the dashboard page (static files, no build step) and the JSON routes it polls.

The page itself is public (it holds no data); every ``/ui/api`` route needs a job token (that
job only) or the admin token (every job), exactly like the rest of the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import httpx
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from redis.asyncio import Redis

from services.protocol import ErrorCode, PlatformError
from services.protocol.dashboard import History, Overview, TrajectoryPage
from services.rollout_api.context import AuthCaller, Ctx
from services.rollout_api.dashboard.history import Sampler, read_history
from services.rollout_api.dashboard.overview import JobViews, overview
from services.rollout_api.dashboard.sources import FleetSources
from services.rollout_api.dashboard.summaries import Filters, entries_before, summary
from services.rollout_api.dashboard.viewer import TokenTexts, detail, jsonl
from services.rollout_api.jobs import job_or_404
from services.rollout_api.settings import ApiSettings

STATIC = Path(__file__).parent / "static"
MAX_SCAN = 2_000  # stream entries one list request looks at before answering with a cursor

router = APIRouter(prefix="/ui")


@dataclass
class Dashboard:
    sources: FleetSources
    views: JobViews
    tokens: TokenTexts
    sampler: Sampler


async def get_dashboard(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard


Dash = Annotated[Dashboard, Depends(get_dashboard)]


async def filters(
    rollout: str | None = None,
    status: str | None = None,
    cap: str | None = None,
    weight_version: str | None = None,
    min_reward: float | None = Query(None, allow_inf_nan=False),
    max_reward: float | None = Query(None, allow_inf_nan=False),
) -> Filters:
    return Filters(rollout, status, cap, weight_version, min_reward, max_reward)


TrajectoryFilters = Annotated[Filters, Depends(filters)]


@router.get("", include_in_schema=False)
async def page_redirect() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/api/overview")
async def get_overview(ctx: Ctx, dash: Dash, caller: AuthCaller) -> Overview:
    return await overview(ctx.redis, dash.sources, dash.views, caller)


@router.get("/api/history")
async def get_history(ctx: Ctx, caller: AuthCaller, job: str | None = None) -> History:
    if job is not None:
        caller.require_job(job)
        await job_or_404(ctx, job)
    return await read_history(ctx.redis, job)


@router.get("/api/trajectories")
async def list_trajectories(
    ctx: Ctx,
    caller: AuthCaller,
    job: str,
    wanted: TrajectoryFilters,
    before: str | None = Query(None, pattern=r"^\d+-\d+$"),
    limit: int = Query(50, ge=1, le=500),
) -> TrajectoryPage:
    caller.require_job(job)
    await job_or_404(ctx, job)
    rows, scanned, last = [], 0, None
    async for entry_id, fields in entries_before(ctx.redis, job, before, MAX_SCAN):
        scanned, last = scanned + 1, entry_id
        found = summary(fields)
        if wanted.match(found):
            rows.append(found.row(entry_id))
            if len(rows) == limit:
                break
    more = last is not None and (len(rows) == limit or scanned == MAX_SCAN)
    return TrajectoryPage(items=rows, next=last if more else None, scanned=scanned)


@router.get("/api/trajectories.jsonl")
async def download(
    ctx: Ctx, caller: AuthCaller, job: str, wanted: TrajectoryFilters, limit: int = Query(10_000, ge=1, le=100_000)
) -> StreamingResponse:
    caller.require_job(job)
    await job_or_404(ctx, job)
    headers = {"Content-Disposition": f'attachment; filename="{job}-trajectories.jsonl"'}
    return StreamingResponse(jsonl(ctx.redis, job, wanted, limit), media_type="application/x-ndjson", headers=headers)


@router.get("/api/trajectories/{job}/{entry_id}")
async def get_trajectory(job: str, entry_id: str, ctx: Ctx, dash: Dash, caller: AuthCaller) -> Response:
    caller.require_job(job)
    await job_or_404(ctx, job)
    if not entry_id.replace("-", "").isdigit():
        raise PlatformError(ErrorCode.BAD_REQUEST, f"bad entry id {entry_id!r}", field="entry_id")
    body = await detail(ctx.redis, job, entry_id, dash.tokens)
    return Response(body, media_type="application/json")


def build(settings: ApiSettings, redis: Redis, http: httpx.AsyncClient) -> Dashboard:
    sources = FleetSources(http, settings)
    sampler = Sampler(redis, sources, settings.dashboard_sample_s, settings.dashboard_history_s)
    views = JobViews(redis, settings.dashboard_cache_s)
    return Dashboard(sources=sources, views=views, tokens=TokenTexts(settings.tokenizer_path), sampler=sampler)


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

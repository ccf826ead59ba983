"""``POST /rollout/stage_weights``: the platform's own engine-host route (not SGLang's). The proxy
calls it for every engine before a weight update: the host fetches the export from the weight
store into its disk and verifies its checksum, and answers the local path the engine then loads
with ``/update_weights_from_disk``. Stand-in engines serve it beside SGLang's routes; with
``--mode sglang`` the launcher serves it on ``stage_port``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web

from services.engines.responses import json_response, read_json
from services.engines.weight_store import StageError, stage
from services.protocol.weights import STAGE_WEIGHTS_PATH

log = logging.getLogger(__name__)
CACHE_DIR = web.AppKey("weight_cache_dir", Path)


async def stage_weights(request: web.Request) -> web.Response:
    body = await read_json(request)
    location, checksum = body.get("location"), body.get("checksum")
    if not isinstance(location, str) or not isinstance(checksum, str):
        return json_response({"success": False, "message": "location and checksum are required"}, 400)
    try:
        path = await asyncio.to_thread(stage, location, checksum, request.app[CACHE_DIR])
    except (StageError, OSError) as exc:
        log.warning("staging %s failed: %s", location, exc)
        return json_response({"success": False, "message": str(exc)}, 400)
    log.info("staged %s at %s (checksum verified)", location, path)
    return json_response({"success": True, "path": str(path)})


def add_stage_route(app: web.Application, cache_dir: Path) -> None:
    app[CACHE_DIR] = cache_dir
    app.router.add_post(STAGE_WEIGHTS_PATH, stage_weights)

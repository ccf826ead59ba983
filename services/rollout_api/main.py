"""Run the rollout API: settings in, uvicorn out."""

from __future__ import annotations

import logging

import uvicorn

from services.rollout_api.app import create_app
from services.rollout_api.settings import ApiSettings
from services.runtime.http_errors import ErrorBodyHttp
from services.runtime.limits import raise_fd_limit
from services.runtime.logs import configure_logging
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.settings import RedisSettings
from services.runtime.slow_clients import ClientLimits, ConnectionStats, uvicorn_options

log = logging.getLogger(__name__)


def run(settings: ApiSettings) -> int:
    configure_logging(settings.log_level)
    if not settings.admin_token:
        log.warning("no admin token (%s): jobs cannot be created", settings.variables("admin_token"))
    raise_fd_limit()
    with redis_url_or_embedded(settings.redis_url) as url:
        limits = ClientLimits(settings.http_header_timeout_s, settings.http_body_timeout_s, settings.http_keepalive_s)
        connections = ConnectionStats()
        app = create_app(settings, url, RedisSettings(), connections=(limits, connections))
        uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                    **uvicorn_options(ErrorBodyHttp, limits, connections))  # fmt: skip
    return 0

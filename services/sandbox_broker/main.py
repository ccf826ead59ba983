"""Entrypoint: resolve Redis (configured or embedded), build the app, serve it.

The event loop is asyncio's, not uvloop: every local command is a child process, and CPython
spawns them with vfork (uvloop forks, copying the broker's page tables each time).
"""

from __future__ import annotations

import logging
import os

import uvicorn

from services.runtime.http_writes import BatchedWritesHttp
from services.runtime.limits import raise_fd_limit
from services.runtime.logs import configure_logging
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.slow_clients import ClientLimits, ConnectionStats, uvicorn_options
from services.sandbox_broker import hot_routes
from services.sandbox_broker.app import create_app
from services.sandbox_broker.settings import BrokerSettings

log = logging.getLogger(__name__)


# What the sandbox uid may read and search among the broker's files (its state directory's sandboxes, their
# /etc files, the gateway directory) is made under this umask, and every sandbox's processes inherit it (a
# container's is the same). A hardened shell's 027 or 077 left them unreachable: the broker refused to start
# ("every directory above ... must be searchable by uid 1000"). The broker's other files get the modes they
# have under the usual default (systemd's and a container's UMask is 0022 too); its state directory stays 0711.
UMASK = 0o022


def run(settings: BrokerSettings) -> int:
    os.umask(UMASK)
    configure_logging(settings.log_level)
    raise_fd_limit()
    with redis_url_or_embedded(settings.redis_url) as redis_url:
        limits = ClientLimits(settings.http_header_timeout_s, settings.http_body_timeout_s, settings.http_keepalive_s)
        connections = ConnectionStats()
        app = hot_routes.Front(create_app(settings, redis_url, connections=(limits, connections)))
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                                loop="asyncio", **uvicorn_options(BatchedWritesHttp, limits, connections))  # fmt: skip
        uvicorn.Server(config).run()
    return 0

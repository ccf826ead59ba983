"""Every limit of one proxy process, explicit and named, for ``rollout_proxy_limit{limit}``.

A limit nobody set is still a limit (aiohttp's 8 KiB header lines, the kernel's ``somaxconn``
under the listen backlog, the open-file soft limit): each one is listed here with the value in
force, 0 meaning none, so a dashboard can show used / limit for all of them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp

from services.llm_proxy.admission import QueueLimits
from services.llm_proxy.settings import ProxySettings
from services.runtime.limits import fd_usage

log = logging.getLogger(__name__)

SOMAXCONN = Path("/proc/sys/net/core/somaxconn")
# aiohttp's server parser limits, passed explicitly (its defaults) so they are on record
MAX_LINE_BYTES = 8190  # request line
MAX_FIELD_BYTES = 8190  # one header
MAX_HEADERS = 128


def queue_limits(settings: ProxySettings) -> QueueLimits:
    """The overload queue of one process; ``engine_max_in_flight`` is split over the processes."""
    total = settings.engine_max_in_flight
    slots = 0 if total == 0 else max(1, -(-total // settings.workers))
    return QueueLimits(slots, settings.queue_max_calls, settings.queue_max_bytes, settings.queue_wait_s)


def somaxconn() -> int:
    """The kernel's cap on any listen backlog (0 when unknown)."""
    try:
        return int(SOMAXCONN.read_text().strip())
    except (OSError, ValueError):
        return 0


def listen_backlog(settings: ProxySettings, *, warn: bool = False) -> int:
    """The accept queue each process gets: the setting, capped by the kernel (logged when ``warn``)."""
    cap = somaxconn()
    if cap and settings.listen_backlog > cap:
        if warn:
            log.warning("listen_backlog %d is capped by net.core.somaxconn=%d", settings.listen_backlog, cap)
        return cap
    return settings.listen_backlog


def process_limits(settings: ProxySettings, session: aiohttp.ClientSession) -> dict[str, float]:
    queue = queue_limits(settings)
    connector = session.connector
    return {
        "engine_in_flight": queue.slots,  # per engine, this process
        "queue_calls": queue.max_calls,
        "queue_bytes": queue.max_bytes,
        "queue_wait_seconds": queue.wait_s,
        "hold_queue_calls": settings.hold_queue_max,
        "upstream_connections": connector.limit if connector else 0,
        "upstream_connections_per_host": connector.limit_per_host if connector else 0,
        "listen_backlog": listen_backlog(settings),
        "somaxconn": somaxconn(),
        "request_body_bytes": settings.max_body_bytes,
        "request_line_bytes": MAX_LINE_BYTES,
        "header_field_bytes": MAX_FIELD_BYTES,
        "headers": MAX_HEADERS,
        "open_files": fd_usage()[1],
    }

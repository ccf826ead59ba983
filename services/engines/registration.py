"""An engine joins its proxy pool once it is healthy and leaves it when it stops.

With ``proxy_url`` set, every engine this process serves (stand-in or SGLang) is added to
``pool`` through the proxy's admin API, at the address the proxy reaches it by. Membership is
kept in Redis by the proxy, so registering with any proxy replica reaches all of them.
"""

from __future__ import annotations

import logging

import httpx

from services.engines.settings import EngineSettings

log = logging.getLogger(__name__)


def engine_urls(settings: EngineSettings) -> list[str]:
    """The URLs the proxy calls this process's engines at."""
    host = settings.advertise_host or settings.host
    return [f"http://{host}:{settings.port + i}" for i in range(settings.count)]


def stage_port(settings: EngineSettings) -> int:
    """Where the sglang launcher serves ``/rollout/stage_weights`` (stand-ins serve it themselves)."""
    return settings.stage_port or settings.port + 1


def stage_urls(settings: EngineSettings) -> list[str]:
    """Where the proxy asks each engine's host to fetch and verify an export."""
    if settings.mode != "sglang":
        return engine_urls(settings)
    return [f"http://{settings.advertise_host or settings.host}:{stage_port(settings)}"]


def _post(settings: EngineSettings, path: str, body: dict[str, str]) -> None:
    assert settings.proxy_url is not None
    token = settings.admin_token.split(",")[0].strip()  # servers accept a list; a client sends the first
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(settings.proxy_url.rstrip("/") + path, json=body, headers=headers, timeout=30.0)
    if response.status_code >= 400:
        raise RuntimeError(f"proxy {path} answered {response.status_code}: {response.text[:500]}")


def join_pool(settings: EngineSettings) -> None:
    """Add every engine of this process to its pool (a no-op without ``proxy_url``)."""
    if settings.proxy_url is None:
        return
    for url, stage_url in zip(engine_urls(settings), stage_urls(settings), strict=True):
        _post(settings, "/admin/engines", {"url": url, "pool": settings.pool, "stage_url": stage_url})
        log.info("joined pool %s of %s as %s", settings.pool, settings.proxy_url, url)


def leave_pool(settings: EngineSettings) -> None:
    """Remove this process's engines from the proxy; failures are logged, never raised (shutdown)."""
    if settings.proxy_url is None:
        return
    for url in engine_urls(settings):
        try:
            _post(settings, "/admin/engines/remove", {"url": url})
        except (httpx.HTTPError, RuntimeError) as exc:
            log.warning("could not leave pool %s as %s: %s", settings.pool, url, exc)

"""An engine joins its proxy pool once it is healthy and leaves it when it stops.

With ``proxy_url`` set, every engine this process serves (stand-in or SGLang) is added to
``pool`` through the proxy's admin API, at the address the proxy reaches it by. Membership is
kept in Redis by the proxy, so registering with any proxy replica reaches all of them.

A Redis that restarts empty takes the membership with it: ``keep_joined`` checks every
``rejoin_check_s`` that this process's engines are still listed (``GET /admin/status``), and joins
again those that are missing once the proxy's store generation has changed since they joined. An
engine removed by an operator in the same generation stays out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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


def _status(settings: EngineSettings) -> dict[str, Any]:
    assert settings.proxy_url is not None
    token = settings.admin_token.split(",")[0].strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(settings.proxy_url.rstrip("/") + "/admin/status", headers=headers, timeout=30.0)
    if response.status_code >= 400:
        raise RuntimeError(f"proxy /admin/status answered {response.status_code}: {response.text[:500]}")
    status: dict[str, Any] = response.json()
    return status


def join_pool(settings: EngineSettings, only: set[str] | None = None) -> None:
    """Add every engine of this process (or those of ``only``) to its pool (a no-op without ``proxy_url``)."""
    if settings.proxy_url is None:
        return
    for url, stage_url in zip(engine_urls(settings), stage_urls(settings), strict=True):
        if only is not None and url not in only:
            continue
        _post(settings, "/admin/engines", {"url": url, "pool": settings.pool, "stage_url": stage_url})
        log.info("joined pool %s of %s as %s", settings.pool, settings.proxy_url, url)


class Membership:
    """This process's engines as the proxy lists them, checked now and then (``keep_joined``)."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.generation: str | None = None  # the proxy's store generation when the engines last joined
        self.rejoined = 0  # times engines joined again after the store lost them
        self._failing = False

    def joining(self) -> None:
        """About to join: remember the store generation first. Read after the join instead, a store
        lost in between would already show its new generation, and the engines missing from it
        would look removed on purpose."""
        self.generation = _status(self.settings).get("store_generation")

    def check(self) -> set[str]:
        """Join again the engines missing from a store that lost its state; the URLs joined."""
        status = _status(self.settings)
        generation = status.get("store_generation")
        listed = {e["url"] for pool in status.get("pools", {}).values() for e in pool.get("engines", [])}
        missing = set(engine_urls(self.settings)) - listed
        if not missing or generation is None or generation == self.generation:
            return set()  # all there, or removed on purpose in the same store
        log.warning("the proxy's store lost its state (generation %s, now %s): joining pool %s again as %s",
                    self.generation, generation, self.settings.pool, ", ".join(sorted(missing)))  # fmt: skip
        join_pool(self.settings, missing)
        self.generation = generation
        self.rejoined += 1
        return missing

    async def keep_joined(self) -> None:
        """``check`` every ``rejoin_check_s`` until cancelled; a proxy that does not answer is logged once."""
        while True:
            await asyncio.sleep(self.settings.rejoin_check_s)
            try:
                await asyncio.to_thread(self.check)
                if self._failing:
                    log.info("the proxy answers again: membership checks resumed")
                self._failing = False
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                if not self._failing:
                    log.warning("membership check with %s failed (%s); retrying every %.0fs", self.settings.proxy_url,
                                exc, self.settings.rejoin_check_s)  # fmt: skip
                self._failing = True


def leave_pool(settings: EngineSettings) -> None:
    """Remove this process's engines from the proxy; failures are logged, never raised (shutdown)."""
    if settings.proxy_url is None:
        return
    for url in engine_urls(settings):
        try:
            _post(settings, "/admin/engines/remove", {"url": url})
        except (httpx.HTTPError, RuntimeError) as exc:
            log.warning("could not leave pool %s as %s: %s", settings.pool, url, exc)


async def join_and_watch(settings: EngineSettings) -> asyncio.Task[None] | None:
    """``join_pool``, then ``Membership.keep_joined`` in the background (None without ``proxy_url``)."""
    if settings.proxy_url is None:
        return None
    membership = Membership(settings)
    try:
        await asyncio.to_thread(membership.joining)
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:  # generation None: a missing engine joins again
        log.warning("could not read the proxy's store generation before joining: %s", exc)
    await asyncio.to_thread(join_pool, settings)
    return asyncio.get_running_loop().create_task(membership.keep_joined(), name="membership")

"""The broker's template names, for rejecting unknown templates at submission (400)."""

from __future__ import annotations

import logging
import time

import httpx

log = logging.getLogger(__name__)


class TemplateCatalog:
    """``GET {broker}/templates``, reused for ``ttl_s``. Unknown (None) when no broker is configured
    or it cannot be reached: then nothing is rejected here and the worker reports the failure."""

    def __init__(self, broker_url: str | None, ttl_s: float, token: str = "") -> None:
        self._url = broker_url.rstrip("/") if broker_url else None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ttl_s = ttl_s
        self._names: frozenset[str] | None = None
        self._fetched_at = 0.0

    async def names(self, client: httpx.AsyncClient) -> frozenset[str] | None:
        if self._url is None:
            return None
        if self._names is not None and time.monotonic() - self._fetched_at < self._ttl_s:
            return self._names
        try:
            response = await client.get(f"{self._url}/templates", timeout=5.0, headers=self._headers)
            response.raise_for_status()
            self._names = frozenset(str(t["name"]) for t in response.json())
            self._fetched_at = time.monotonic()
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("broker templates unavailable (%s); not checking templates", exc)
            return self._names
        return self._names

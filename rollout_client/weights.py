"""Post new weights through the LLM proxy's weight-update transaction and wait for its verdict.

An export is a Hugging Face model directory (``config.json``, safetensors, tokenizer files) with a
``CHECKSUM`` file (:func:`seal`: sha256 over the other files, ``services.protocol.weights.tree_checksum``).
:class:`WeightPublisher` puts it where engine hosts can read it (:mod:`rollout_client.weight_store`),
POSTs a ``WeightUpdate`` to ``<proxy>/admin/weights`` and returns the fleet's verdict: every engine
of the pool reports the new version afterwards (``ok``), or the ones that failed were quarantined.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from rollout_client.weight_store import publish
from services.protocol.fields import DEFAULT_POOL
from services.protocol.weights import CHECKSUM_FILE, WeightUpdate, WeightUpdateResult, tree_checksum

logger = logging.getLogger(__name__)


class Exported(Protocol):
    """What :meth:`WeightPublisher.publish` needs of an export (``trainer_client.export.Export`` is one)."""

    @property
    def version(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def checksum(self) -> str: ...


@dataclass(frozen=True)
class ExportDir:
    """An export directory sealed with :func:`seal`."""

    version: str
    path: Path
    checksum: str


def seal(directory: Path, version: str) -> ExportDir:
    """Write ``CHECKSUM`` into a finished model directory (last, over every other file in name order)."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
    checksum = tree_checksum((file.name, [file.read_bytes()]) for file in files)
    (directory / CHECKSUM_FILE).write_text(checksum + "\n")
    return ExportDir(version, directory, checksum)


@dataclass(frozen=True)
class SyncOutcome:
    ok: bool
    seconds: float
    result: WeightUpdateResult | None
    error: str | None = None


def job_pool(job: str, configured: str | None, from_api: str | None) -> str:
    """The pool a job's weights go to: the job's own (``JobCreate.pool``, read back from the API).

    The trainer's ``pool`` setting is only needed without the API; when both are known they must agree.
    """
    if from_api is None:
        return configured or DEFAULT_POOL
    if configured and configured != from_api:
        raise ValueError(f"ROLLOUT_TRAIN_POOL is {configured!r} but job {job!r} is served by pool {from_api!r}")
    return from_api


class WeightPublisher:
    """POSTs a :class:`WeightUpdate` to ``<proxy>/admin/weights``; the answer is the fleet's verdict."""

    def __init__(
        self,
        proxy_url: str,
        pool: str,
        token: str | None = None,
        timeout_s: float = 600.0,
        store_url: str | None = None,
    ) -> None:
        self.pool = pool
        self.store_url = store_url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=proxy_url, timeout=timeout_s, headers=headers)

    def publish(self, export: Exported) -> SyncOutcome:
        """Store ``export`` (where engine hosts can read it) and run the pool's transaction to its version."""
        start = time.perf_counter()
        try:
            location = publish(export.path, self.store_url)
        except (OSError, ValueError) as exc:  # boto3's errors are OSError or ClientError (logged below)
            logger.error("weight export %s could not be stored at %s: %s", export.version, self.store_url, exc)
            return SyncOutcome(False, time.perf_counter() - start, None, str(exc))
        update = WeightUpdate(pool=self.pool, version=export.version, location=location, checksum=export.checksum)
        try:
            response = self.http.post("/admin/weights", content=update.model_dump_json(),
                                      headers={"Content-Type": "application/json"})  # fmt: skip
        except httpx.HTTPError as exc:
            logger.error("weight update %s to pool %s failed: %s", export.version, self.pool, exc)
            return SyncOutcome(False, time.perf_counter() - start, None, str(exc))
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            logger.error(
                "weight update %s refused: HTTP %d %s", export.version, response.status_code, response.text[:300]
            )
            return SyncOutcome(False, elapsed, None, f"HTTP {response.status_code}")
        result = WeightUpdateResult.model_validate_json(response.content)
        if not result.ok or result.quarantined:
            logger.warning("weight update %s: ok=%s quarantined=%s", export.version, result.ok, result.quarantined)
        return SyncOutcome(result.ok, elapsed, result)

    def close(self) -> None:
        self.http.close()

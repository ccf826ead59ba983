"""Task images named by a host path on the docker backend (blocking calls, run in its thread pool).

A template's ``image`` may be an absolute path to an OCI image layout, an OCI archive or a
``docker save`` tar, as on the local backend. It is loaded into the engine once (``docker load``;
Engine 20.10 cannot load an OCI layout, so the image is streamed to it in ``docker save``'s format)
and containers run it by its image ID, which is its config digest: the engine is asked first, so
an image already loaded (by this broker, another replica or an operator) is not loaded again.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import docker.errors

from services.sandbox_broker.images.archive import write_docker_load
from services.sandbox_broker.images.sources import ImageError, open_source

log = logging.getLogger(__name__)

TAG_REPOSITORY = "rollout-images"  # loaded images are tagged rollout-images/<digest hex[:16]>:latest


def is_path(image: str) -> bool:
    return image.startswith("/")


def ensure_loaded(api: Any, path: str, spool_dir: str | None = None) -> str:
    """The engine's ID of the image at ``path``, loading it first when the engine lacks it."""
    source = open_source(Path(path))
    if _present(api, source.digest):
        return source.digest
    started = time.monotonic()
    tag = f"{TAG_REPOSITORY}/{source.digest.partition(':')[2][:16]}:latest"
    with tempfile.TemporaryFile(dir=spool_dir) as spool:
        write_docker_load(source, spool, tag)
        spool.seek(0)
        for message in api.load_image(spool):
            if isinstance(message, dict) and message.get("error"):
                raise ImageError(f"docker load of {path}: {message['error']}")
    if not _present(api, source.digest):  # e.g. a docker save tar whose config is not the digest read
        raise ImageError(f"docker load of {path} did not produce image {source.digest}")
    log.info("loaded image %s (%s) into docker in %.1f s", path, source.digest, time.monotonic() - started)
    return source.digest


def _present(api: Any, image_id: str) -> bool:
    try:
        api.inspect_image(image_id)
    except docker.errors.ImageNotFound:
        return False
    return True

"""The engine host's side of the weight store: fetch an export into local disk and verify the
checksum the trainer wrote, before any engine switches to it.

Locations (``WeightUpdate.location``): a plain path (a directory every host sees at that path:
verified in place), ``file:///path`` (a store directory mounted here, e.g. a ReadWriteMany volume:
copied into the local cache), ``s3://bucket/prefix`` (an S3-compatible object store, through
boto3; the endpoint comes from ``AWS_ENDPOINT_URL`` and credentials from the usual AWS variables).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from services.protocol.weights import CHECKSUM_FILE, tree_checksum

CHUNK = 1 << 20


class StageError(Exception):
    """The export cannot be fetched, or its content does not match its checksum."""


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def verify(directory: Path, checksum: str) -> None:
    """Raise unless the files of ``directory`` (but its CHECKSUM) hash to ``checksum``."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
    found = tree_checksum((f.name, _chunks(f)) for f in files)
    if found != checksum:
        raise StageError(f"checksum mismatch for {directory}: expected {checksum}, found {found}")


def _fetch_s3(bucket: str, prefix: str, target: Path) -> None:
    import boto3  # the [s3] extra: only hosts that use an object store need it

    client = boto3.client("s3")
    paginator = client.get_paginator("list_objects_v2")
    found = 0
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for obj in page.get("Contents", []):
            name = obj["Key"].rsplit("/", 1)[-1]
            client.download_file(bucket, obj["Key"], str(target / name))
            found += 1
    if not found:
        raise StageError(f"nothing stored under s3://{bucket}/{prefix}")


def stage(location: str, checksum: str, cache_dir: Path) -> Path:
    """A local directory holding the verified export named by ``location``."""
    url = urlsplit(location)
    if url.scheme == "":
        source = Path(location)
        if not source.is_dir():
            raise StageError(f"{location} is not a directory on this host")
        verify(source, checksum)
        return source
    name = Path(unquote(url.path)).name or "export"
    target, partial = cache_dir / f"{name}-{checksum[-16:]}", cache_dir / f"{name}.partial"
    if target.is_dir():
        return target  # staged and verified before
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        if url.scheme == "file":
            source = Path(unquote(url.path))
            if not source.is_dir():
                raise StageError(f"{location}: no such directory in the store")
            shutil.copytree(source, partial, dirs_exist_ok=True)
        elif url.scheme == "s3":
            _fetch_s3(url.netloc, url.path.lstrip("/"), partial)
        else:
            raise StageError(f"{location}: unknown weight store scheme {url.scheme!r} (file://, s3://)")
        verify(partial, checksum)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(target)
    return target

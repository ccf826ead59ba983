"""The trainer's side of the weight store: publish an export where engine hosts can fetch it.

``weight_store_url`` picks the store: unset, the export directory itself is announced (every
engine host must see that path: one machine, or a shared volume mounted at the same path);
``file:///mnt/weights`` copies each export into a shared directory (a ReadWriteMany volume);
``s3://bucket/prefix`` uploads it to an S3-compatible object store through boto3 (endpoint from
``AWS_ENDPOINT_URL``). The CHECKSUM file goes last, so a reader never sees a complete-looking,
half-written export; engine hosts verify the checksum before their engines switch.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

from services.protocol.weights import CHECKSUM_FILE


def _ordered(directory: Path) -> list[Path]:
    files = [p for p in directory.iterdir() if p.is_file()]
    return sorted(files, key=lambda p: (p.name == CHECKSUM_FILE, p.name))


def publish(export_dir: Path, store_url: str | None) -> str:
    """Copy or upload ``export_dir`` into the store; return the location to announce."""
    if not store_url:
        return str(export_dir)
    url = urlsplit(store_url)
    if url.scheme == "file":
        target = Path(unquote(url.path)) / export_dir.name
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for file in _ordered(export_dir):
            shutil.copy2(file, partial / file.name)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        return target.as_uri()
    if url.scheme == "s3":
        import boto3  # the [s3] extra

        client = boto3.client("s3")
        prefix = "/".join(p for p in (url.path.strip("/"), export_dir.name) if p)
        for file in _ordered(export_dir):
            client.upload_file(str(file), url.netloc, f"{prefix}/{file.name}")
        return f"s3://{url.netloc}/{prefix}"
    raise ValueError(f"weight_store_url {store_url!r}: use file:///path or s3://bucket/prefix")

"""Writing images without a daemon: layers from directories, and a ``docker save``-format tar
(legacy layout: ``manifest.json``, ``<id>/layer.tar``, ``<hex>.json``) that both this broker's
image store and ``docker load`` read."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from services.sandbox_broker.images.sources import ImageConfig


def layer_from_dir(root: Path, out: Path, *, whiteouts: Sequence[str] = ()) -> Path:
    """A layer tar of everything under ``root`` (paths relative to it, numeric owners kept), plus a
    ``.wh.`` marker for each path in ``whiteouts`` (deleted from the layers below)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name)
        for path in whiteouts:
            parent, _, name = path.strip("/").rpartition("/")
            marker = tarfile.TarInfo(f"{parent}/.wh.{name}" if parent else f".wh.{name}")
            tar.addfile(marker, io.BytesIO(b""))
    return out


def write_docker_archive(out: Path, layers: Sequence[Path], config: ImageConfig, tag: str) -> str:
    """Write the image made of ``layers`` (base first) to ``out``; return its digest."""
    diff_ids = [_sha256_file(layer) for layer in layers]
    runtime = {"Env": list(config.env), "WorkingDir": config.workdir, "User": config.user}
    document = {
        "architecture": "amd64",
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
    }
    raw = json.dumps(document, sort_keys=True).encode()
    config_hex = hashlib.sha256(raw).hexdigest()
    ids = _layer_ids(diff_ids)
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": [tag], "Layers": [f"{i}/layer.tar" for i in ids]}]
    name, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    staging = out.with_name(f".{out.name}.{os.getpid()}")
    with tarfile.open(staging, "w") as tar:
        _add_bytes(tar, f"{config_hex}.json", raw)
        for layer_id, layer in zip(ids, layers, strict=True):
            _add_bytes(tar, f"{layer_id}/VERSION", b"1.0")
            _add_bytes(tar, f"{layer_id}/json", json.dumps({"id": layer_id}).encode())
            tar.add(layer, arcname=f"{layer_id}/layer.tar")
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
        _add_bytes(tar, "repositories", json.dumps({name: {version: ids[-1]}}).encode())
    staging.rename(out)
    return f"sha256:{config_hex}"


def _layer_ids(diff_ids: Sequence[str]) -> list[str]:
    ids, parent = [], ""
    for diff_id in diff_ids:
        parent = hashlib.sha256(f"{parent}\n{diff_id}".encode()).hexdigest()
        ids.append(parent)
    return ids


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: big base layers hash once


def _sha256_file(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        _digests[key] = _hash_file(path)
    return _digests[key]


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_oci_layout(out: Path, layers: Sequence[Path], config: ImageConfig, blobs: Path) -> str:
    """Write the image made of ``layers`` (plain tars, base first) as an OCI image layout in ``out``.
    Blobs live once in ``blobs`` and are hard-linked into each layout (images share their layers);
    returns the config digest."""
    blobs.mkdir(parents=True, exist_ok=True)
    layer_descriptors = [_blob_from_file(layer, blobs, "application/vnd.oci.image.layer.v1.tar") for layer in layers]
    diff_ids = [str(d["digest"]) for d in layer_descriptors]
    runtime = {"Env": list(config.env), "WorkingDir": config.workdir, "User": config.user}
    document = {"architecture": "amd64", "os": "linux", "config": runtime,
                "rootfs": {"type": "layers", "diff_ids": diff_ids}}  # fmt: skip
    config_descriptor = _blob_from_bytes(json.dumps(document, sort_keys=True).encode(), blobs,
                                         "application/vnd.oci.image.config.v1+json")  # fmt: skip
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_descriptor, "layers": layer_descriptors}  # fmt: skip
    manifest_descriptor = _blob_from_bytes(json.dumps(manifest).encode(), blobs,
                                           "application/vnd.oci.image.manifest.v1+json")  # fmt: skip
    (out / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    for descriptor in (*layer_descriptors, config_descriptor, manifest_descriptor):
        hexdigest = str(descriptor["digest"]).split(":", 1)[1]
        target = out / "blobs" / "sha256" / hexdigest
        if not target.exists():
            os.link(blobs / hexdigest, target)
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest_descriptor]}))
    return str(config_descriptor["digest"])


def _blob_from_file(path: Path, blobs: Path, media_type: str) -> dict[str, object]:
    hexdigest = _sha256_file(path)
    if not (blobs / hexdigest).exists():
        shutil.copyfile(path, blobs / f".{hexdigest}")
        (blobs / f".{hexdigest}").rename(blobs / hexdigest)
    return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": path.stat().st_size}


def _blob_from_bytes(data: bytes, blobs: Path, media_type: str) -> dict[str, object]:
    hexdigest = hashlib.sha256(data).hexdigest()
    (blobs / hexdigest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": len(data)}

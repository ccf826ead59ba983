"""Writing images without a daemon: layers from directories, and a ``docker save``-format tar
(legacy layout: ``manifest.json``, ``<id>/layer.tar``, ``<hex>.json``) that both this broker's
image store and ``docker load`` read."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from services.sandbox_broker.images.sources import ImageConfig, ImageError, ImageSource, bundle_of, config_name
from services.sandbox_broker.images.unpack import OPAQUE, WHITEOUT


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


def layer_from_upper(upper: Path, out: Path, owners: dict[int, int], skip: Sequence[str] = ()) -> Path:
    """A layer tar of an overlayfs upper directory: what a sandbox changed over its image. The
    kernel's whiteouts become the image spec's (a 0/0 character device: ``.wh.NAME``; an opaque
    directory: ``.wh..wh..opq`` inside it); owners are mapped through ``owners`` (host uid/gid ->
    the image's), paths in ``skip`` (relative) are left out."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirs, files in os.walk(upper):
            dirs.sort()
            for name in sorted(dirs + files):
                path = Path(directory, name)
                arcname = str(path.relative_to(upper))
                if arcname not in skip:
                    _add_upper_entry(tar, path, arcname, owners)
    return out


def _add_upper_entry(tar: tarfile.TarFile, path: Path, arcname: str, owners: dict[int, int]) -> None:
    st = path.lstat()
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # overlayfs whiteout: NAME was deleted
        parent, _, name = arcname.rpartition("/")
        tar.addfile(tarfile.TarInfo(f"{parent}/{WHITEOUT}{name}" if parent else f"{WHITEOUT}{name}"))
        return
    info = tar.gettarinfo(str(path), arcname)
    info.uid, info.gid = owners.get(info.uid, info.uid), owners.get(info.gid, info.gid)
    info.uname = info.gname = ""
    if info.isreg():
        with open(path, "rb") as data:
            tar.addfile(info, data)
    else:
        tar.addfile(info)
    if stat.S_ISDIR(st.st_mode) and _xattr(path, "trusted.overlay.opaque") == b"y":
        tar.addfile(tarfile.TarInfo(f"{arcname}/{OPAQUE}"))


def _xattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def layer_files(source: ImageSource, dest: Path) -> list[Path]:
    """The source's layers as plain tar files in ``dest`` (decompressed), base first; a root
    directory becomes one layer."""
    dest.mkdir(parents=True, exist_ok=True)
    if source.kind == "dir":
        return [layer_from_dir(source.path, dest / "0.tar")]
    found = []
    with bundle_of(source) as bundle:
        for index, name in enumerate(source.layers):
            target = dest / f"{index}.tar"
            with bundle.open(name) as raw, open(target, "wb") as out:
                compressed = raw.read(2) == b"\x1f\x8b"  # gzip's magic (blobs are seekable files)
                raw.seek(0)
                shutil.copyfileobj(gzip.GzipFile(fileobj=raw) if compressed else raw, out, 1 << 20)
            found.append(target)
    return found


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


def write_docker_load(source: ImageSource, out: IO[bytes], tag: str) -> None:
    """``source`` as the tar ``docker load`` reads on every Engine version (20.10 reads only
    ``manifest.json``, not an OCI layout's ``index.json``): a ``docker save`` tar is copied as it
    is; an OCI image gets a ``manifest.json`` naming its config and layer blobs, which go in as
    they are (compressed or not: docker checks each layer against the config's ``diff_ids``)."""
    if source.kind == "dir":
        raise ImageError(f"{source.path} is a root directory, not an image docker can load "
                         "(make one with `rollout images build`)")  # fmt: skip
    if source.kind == "docker-archive":  # a tar as it is; an unpacked one tarred again
        if source.path.is_file():
            with open(source.path, "rb") as archive:
                shutil.copyfileobj(archive, out, 1 << 20)
            return
        with tarfile.open(fileobj=out, mode="w|") as tar:
            for entry in sorted(source.path.iterdir()):
                tar.add(entry, arcname=entry.name)
        return
    config = config_name(source)
    manifest = [{"Config": config, "RepoTags": [tag], "Layers": list(source.layers)}]
    with bundle_of(source) as bundle, tarfile.open(fileobj=out, mode="w|") as tar:
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
        for name in dict.fromkeys((config, *source.layers)):  # a layer twice in one image goes in once
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = bundle.size(name), 0o644, int(time.time())
            with bundle.open(name) as blob:
                tar.addfile(info, blob)


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

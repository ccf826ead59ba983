"""What an image source is, and how to read one without a registry or a daemon.

An image source is a path to one of:

- an OCI image layout directory (``oci-layout``, ``index.json``, ``blobs/sha256/...``);
- a tar of one: ``docker save`` (legacy ``manifest.json`` + ``<id>/layer.tar``, or Engine >= 25's
  OCI content with a ``manifest.json`` beside it) or an ``oci-archive``;
- a directory that is the root filesystem itself (no layers, no config).

``open_source`` reads only the manifest and the config; layers are streamed when unpacked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


class ImageError(ValueError):
    """The source is not an image this module can read."""


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """The runtime defaults of an image (its config's ``config`` object)."""

    env: tuple[str, ...] = (f"PATH={DEFAULT_PATH}",)
    workdir: str = ""  # "" means /
    user: str = ""  # name, uid, name:group or uid:gid; "" means root

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> ImageConfig:
        runtime = config.get("config") or {}
        env = tuple(runtime.get("Env") or ())
        if not any(e.startswith("PATH=") for e in env):
            env = (f"PATH={DEFAULT_PATH}", *env)
        return cls(env=env, workdir=runtime.get("WorkingDir") or "", user=runtime.get("User") or "")

    def as_dict(self) -> dict[str, Any]:
        return {"Env": list(self.env), "WorkingDir": self.workdir, "User": self.user}

    def env_map(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.env if "=" in item)


@dataclass(frozen=True, slots=True)
class ImageSource:
    """An image found at ``path``: its digest names the unpacked tree."""

    kind: Literal["oci", "docker-archive", "oci-archive", "dir"]
    path: Path
    digest: str  # "sha256:<hex>": the config's digest, or a digest of a directory's listing
    config: ImageConfig = field(default_factory=ImageConfig)
    layers: tuple[str, ...] = ()  # names inside the bundle, base layer first
    layer_digests: tuple[str, ...] = ()  # one per layer: what names its unpacked tree


class Bundle:
    """Files of an image layout, in a directory or inside a tar."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None if path.is_dir() else tarfile.open(path)  # noqa: SIM115 (closed by close())

    def exists(self, name: str) -> bool:
        if self.tar is None:
            return (self.path / name).is_file()
        with contextlib.suppress(KeyError):
            return self.tar.getmember(name).isfile()
        return False

    def open(self, name: str) -> IO[bytes]:
        if self.tar is None:
            return open(self.path / name, "rb")
        member = self.tar.extractfile(self.tar.getmember(name))
        if member is None:
            raise ImageError(f"{name} is not a file in {self.path}")
        return member

    def size(self, name: str) -> int:
        return (self.path / name).stat().st_size if self.tar is None else self.tar.getmember(name).size

    def json(self, name: str) -> Any:
        with self.open(name) as f:
            return json.load(f)

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


def open_source(path: Path) -> ImageSource:
    """Read the manifest and config of the image at ``path`` (see the module docstring)."""
    if not path.exists():
        raise ImageError(f"no image at {path}")
    if path.is_dir() and not (path / "oci-layout").is_file():
        return ImageSource("dir", path, directory_digest(path))
    try:
        bundle = Bundle(path)
    except (tarfile.TarError, OSError) as exc:
        raise ImageError(f"{path} is neither a directory nor a tar: {exc}") from exc
    try:
        if bundle.exists("manifest.json"):
            return _docker_archive(bundle)
        if bundle.exists("index.json"):
            return _oci(bundle)
        raise ImageError(f"{path} has neither manifest.json (docker save) nor index.json (OCI layout)")
    except ImageError:
        raise
    except (KeyError, ValueError, TypeError, IndexError, OSError) as exc:
        raise ImageError(f"{path}: unreadable image ({exc!r})") from exc
    finally:
        bundle.close()


def _docker_archive(bundle: Bundle) -> ImageSource:
    manifest = bundle.json("manifest.json")[0]
    config_name = manifest["Config"]
    with bundle.open(config_name) as f:
        raw = f.read()
    document = json.loads(raw)
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    names = tuple(manifest["Layers"])
    diff_ids = tuple((document.get("rootfs") or {}).get("diff_ids") or ())
    if len(diff_ids) != len(names):  # no usable diff_ids: a layer is only known within this image
        diff_ids = tuple(f"{digest}/{i}" for i in range(len(names)))
    return ImageSource("docker-archive", bundle.path, digest, ImageConfig.from_json(document), names, diff_ids)


def _oci(bundle: Bundle) -> ImageSource:
    descriptor = bundle.json("index.json")["manifests"][0]
    while descriptor.get("mediaType") in _INDEX_TYPES:
        descriptor = bundle.json(_blob(descriptor["digest"]))["manifests"][0]
    manifest = bundle.json(_blob(descriptor["digest"]))
    config = ImageConfig.from_json(bundle.json(_blob(manifest["config"]["digest"])))
    layers = tuple(_blob(layer["digest"]) for layer in manifest["layers"])
    kind: Literal["oci", "oci-archive"] = "oci" if bundle.tar is None else "oci-archive"
    digests = tuple(layer["digest"] for layer in manifest["layers"])
    return ImageSource(kind, bundle.path, manifest["config"]["digest"], config, layers, digests)


def _blob(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    if not hexdigest or "/" in hexdigest or algorithm not in ("sha256", "sha512"):
        raise ImageError(f"bad digest {digest!r}")
    return f"blobs/{algorithm}/{hexdigest}"


@contextlib.contextmanager
def bundle_of(source: ImageSource) -> Iterator[Bundle]:
    """The files of ``source``'s layout (its manifest, config and layer blobs), open while in use."""
    bundle = Bundle(source.path)
    try:
        yield bundle
    finally:
        bundle.close()


def config_name(source: ImageSource) -> str:
    """Where the config document lies inside an OCI bundle."""
    return _blob(source.digest)


@contextlib.contextmanager
def layers(source: ImageSource) -> Iterator[Iterator[tarfile.TarFile]]:
    """The source's layers as streamed tars (gzip or plain), base layer first."""

    def each(bundle: Bundle) -> Iterator[tarfile.TarFile]:
        for name in source.layers:
            with bundle.open(name) as raw, tarfile.open(fileobj=raw, mode="r|*") as layer:
                yield layer

    with bundle_of(source) as bundle:
        yield each(bundle)


def directory_digest(root: Path) -> str:
    """A digest of a root directory's listing (names, types, sizes, modes, mtimes): a changed tree
    gets a new digest, hence a fresh unpacked copy."""
    h = hashlib.sha256(str(root.resolve()).encode())
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            st = os.lstat(os.path.join(directory, name))
            h.update(f"{directory}/{name}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "sha256:" + h.hexdigest()

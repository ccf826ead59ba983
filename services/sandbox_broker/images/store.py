"""The image store of one host: names -> sources, and one unpacked tree per image digest.

Layout under ``<state_dir>/images``::

    refs.json                 {"name": {"source": "/abs/path", "config": {...} | null}}
    trees/<hex24>/rootfs      one unpacked layer (overlay format), or a whole flattened image
    trees/<hex24>/image.json  {"digest", "source", "size", "last_used"}
    .staging-*                half-made trees (removed at start)

With overlayfs (``layered``), every layer is unpacked once per layer digest and images stack their
layers as overlay lower directories (a base layer shared by many task images is on disk once);
without it, an image is flattened into one tree per image digest. Trees are owned by the sandbox
uid. They are a cache: over the byte budget, the least recently used trees that no sandbox uses
are removed, and the next lease unpacks them again from the image's source. Several processes on
one host share the store (an ``flock`` serialises unpacking and eviction).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.sandbox_broker.images.sources import ImageConfig, ImageError, ImageSource, layers, open_source
from services.sandbox_broker.images.unpack import chown_tree, tree_size, unpack, unpack_layer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """An image ready to be a sandbox's lower layer."""

    digest: str
    layers: tuple[Path, ...]  # top first (overlay ``lowerdir`` order); one tree when flattened
    layer_digests: tuple[str, ...]  # the trees' digests (what a sandbox holds in use)
    config: ImageConfig
    prepare_s: float = 0.0  # time spent unpacking now (0 when every tree was already there)

    @property
    def rootfs(self) -> Path:
        """The flattened tree (only meaningful when there is one layer)."""
        return self.layers[0]


@dataclass(frozen=True, slots=True)
class StoredImage:
    name: str | None
    source: str
    digest: str | None
    size: int
    last_used: float


class ImageStore:
    def __init__(self, root: Path, uid: int, budget_bytes: int, in_use: Callable[[], set[str]] = set) -> None:
        self.root = root
        self.uid = uid
        self.budget = budget_bytes
        self.in_use = in_use  # digests the host's sandboxes use now (never evicted)
        self._lock = threading.Lock()
        self._digests: dict[tuple[str, int, int], ImageSource] = {}

    @property
    def trees(self) -> Path:
        return self.root / "trees"

    # -- names ---------------------------------------------------------------------------------

    def refs(self) -> dict[str, dict[str, Any]]:
        try:
            refs: dict[str, dict[str, Any]] = json.loads((self.root / "refs.json").read_text())
        except FileNotFoundError:
            return {}
        return refs

    def tag(self, name: str, source: Path, config: ImageConfig | None = None) -> ImageSource:
        """Name the image at ``source`` (read now, to refuse what is not an image)."""
        found = self._open(source.resolve())
        with self._locked():
            refs = self.refs()
            refs[name] = {"source": str(source.resolve()), "config": config.as_dict() if config else None}
            self._write_refs(refs)
        return found

    def untag(self, name: str) -> bool:
        with self._locked():
            refs = self.refs()
            entry = refs.pop(name, None)
            self._write_refs(refs)
        if entry is not None:
            self.evict(keep=set())
        return entry is not None

    def _write_refs(self, refs: dict[str, dict[str, Any]]) -> None:
        staging = self.root / f".refs.{os.getpid()}.{threading.get_ident()}"
        staging.write_text(json.dumps(refs, indent=1, sort_keys=True))
        staging.rename(self.root / "refs.json")

    # -- trees ---------------------------------------------------------------------------------

    def resolve(self, ref: str) -> tuple[ImageSource, ImageConfig]:
        """A store name, or an absolute path to an image source."""
        entry = self.refs().get(ref)
        if entry is not None:
            source = self._open(Path(entry["source"]))
            override = entry.get("config")
            config = ImageConfig.from_json({"config": override}) if override else source.config
            return source, config
        if not os.path.isabs(ref):
            raise ImageError(f"no image named {ref!r} in the store (and not an absolute path)")
        source = self._open(Path(ref))
        return source, source.config

    def prepare(self, ref: str, layered: bool = False) -> PreparedImage:
        """The unpacked trees of ``ref`` (its layers when ``layered`` and it has any, else one
        flattened tree), unpacking what this host does not have yet."""
        source, config = self.resolve(ref)
        started = time.monotonic()
        digests = source.layer_digests if layered and source.layer_digests else (source.digest,)
        trees = [self.trees / _tree_name(d) for d in digests]
        with self._locked():
            missing = [i for i, tree in enumerate(trees) if not (tree / "rootfs").is_dir()]
            if missing:
                self._unpack(source, trees, digests, missing, layered)
            for tree in trees:
                self._touch(tree)
        if missing:
            self.evict(keep=set(digests))
        took = time.monotonic() - started if missing else 0.0
        top_first = tuple(tree / "rootfs" for tree in reversed(trees))
        return PreparedImage(source.digest, top_first, tuple(digests), config, took)

    def _unpack(
        self, source: ImageSource, trees: list[Path], digests: tuple[str, ...], missing: list[int], layered: bool
    ) -> None:
        staged = []
        try:
            if layered and source.layer_digests:
                with layers(source) as each:
                    for index, layer in enumerate(each):
                        if index in missing:
                            staged.append(self._stage(trees[index], lambda d, t=layer: unpack_layer(t, d)))  # type: ignore[misc]
            else:
                staged.append(self._stage(trees[0], lambda d: unpack(source, d)))
            for index, staging in zip(missing, staged, strict=True):
                meta = {"digest": digests[index], "source": str(source.path), "size": tree_size(staging)}
                (staging / "image.json").write_text(json.dumps(meta))
                staging.rename(trees[index])
        finally:
            for staging in staged:
                shutil.rmtree(staging, ignore_errors=True)
        log.info("unpacked %d tree(s) of image %s from %s", len(missing), source.digest, source.path)

    def _stage(self, tree: Path, make: Callable[[Path], None]) -> Path:
        staging = self.root / f".staging-{tree.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        self.trees.mkdir(parents=True, exist_ok=True)
        make(staging / "rootfs")
        chown_tree(staging / "rootfs", self.uid)
        return staging

    def _touch(self, tree: Path) -> None:
        meta = _read_meta(tree)
        meta["last_used"] = time.time()
        (tree / "image.json").write_text(json.dumps(meta))

    def evict(self, keep: set[str]) -> list[str]:
        """Remove least recently used trees until the store fits its budget; never one in ``keep``
        or in use by a sandbox. Returns the digests removed."""
        removed: list[str] = []
        with self._locked():
            trees = sorted(self._tree_metas(), key=lambda t: t[1].get("last_used", 0.0))
            total = sum(int(meta.get("size", 0)) for _, meta in trees)
            protected = keep | self.in_use()
            for tree, meta in trees:
                if total <= self.budget:
                    break
                if meta.get("digest") in protected:
                    continue
                shutil.rmtree(tree, ignore_errors=True)
                total -= int(meta.get("size", 0))
                removed.append(str(meta.get("digest")))
        for digest in removed:
            log.info("image store over budget: evicted %s", digest)
        return removed

    def clean(self) -> None:
        """At start: remove half-made trees (a process killed while unpacking), then fit the budget."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)
        for leftover in self.root.glob(".staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        self.evict(keep=set())

    def list(self) -> list[StoredImage]:
        """Named images (with their tree, if unpacked) and unnamed trees (templates' paths)."""
        trees = {meta.get("source"): meta for _, meta in self._tree_metas()}
        listed = []
        for name, entry in sorted(self.refs().items()):
            meta = trees.pop(entry["source"], {})
            listed.append(StoredImage(name, entry["source"], meta.get("digest"), meta.get("size", 0),
                                      meta.get("last_used", 0.0)))  # fmt: skip
        for source, meta in trees.items():
            listed.append(StoredImage(None, str(source), meta.get("digest"), meta.get("size", 0),
                                      meta.get("last_used", 0.0)))  # fmt: skip
        return listed

    def _tree_metas(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        if not self.trees.is_dir():
            return
        for tree in self.trees.iterdir():
            yield tree, _read_meta(tree)

    def _open(self, path: Path) -> ImageSource:
        """``open_source``, remembered per (path, size, mtime): a directory is walked only once."""
        try:
            st = path.stat()
        except OSError as exc:
            raise ImageError(f"no image at {path}") from exc
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = open_source(path)
        return self._digests[key]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.root / ".lock", "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)


def _tree_name(digest: str) -> str:
    return digest.partition(":")[2][:24] or digest[:24]


def _read_meta(tree: Path) -> dict[str, Any]:
    try:
        meta: dict[str, Any] = json.loads((tree / "image.json").read_text())
    except (OSError, ValueError):
        return {"size": 0}
    return meta

"""The image store of one host: names -> sources, and one unpacked tree per image digest.

Layout under ``<state_dir>/images``::

    refs.json                 {"name": {"source": "/abs/path", "config": {...} | null}}
    trees/<hex24>/rootfs      the unpacked root filesystem (owned by the sandbox uid)
    trees/<hex24>/image.json  {"digest", "source", "config", "size", "last_used"}
    .staging-*                half-made trees (removed at start)

Trees are a cache: over the byte budget, the least recently used trees that no sandbox uses are
removed; the next lease of that image unpacks it again from its source. Several processes on one
host share the store (an ``flock`` serialises unpacking and eviction).
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

from services.sandbox_broker.images.sources import ImageConfig, ImageError, ImageSource, open_source
from services.sandbox_broker.images.unpack import chown_tree, tree_size, unpack

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """An image ready to be a sandbox's lower layer."""

    digest: str
    rootfs: Path
    config: ImageConfig
    prepare_s: float = 0.0  # time spent unpacking now (0 when the tree was already there)


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

    def prepare(self, ref: str) -> PreparedImage:
        """The unpacked tree of ``ref``, unpacking it if this host has none yet."""
        source, config = self.resolve(ref)
        tree = self.trees / _tree_name(source.digest)
        started = time.monotonic()
        made = False
        with self._locked():
            if not (tree / "rootfs").is_dir():
                self._unpack(source, tree)
                made = True
            self._touch(tree, source)
        if made:
            self.evict(keep={source.digest})
        return PreparedImage(source.digest, tree / "rootfs", config, time.monotonic() - started if made else 0.0)

    def _unpack(self, source: ImageSource, tree: Path) -> None:
        staging = self.root / f".staging-{tree.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            unpack(source, staging / "rootfs")
            chown_tree(staging / "rootfs", self.uid)
            meta = {"digest": source.digest, "source": str(source.path), "size": tree_size(staging)}
            (staging / "image.json").write_text(json.dumps(meta))
            self.trees.mkdir(parents=True, exist_ok=True)
            staging.rename(tree)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("unpacked image %s from %s into %s", source.digest, source.path, tree)

    def _touch(self, tree: Path, source: ImageSource) -> None:
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

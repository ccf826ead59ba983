"""The local backend's side of images: the host's image store, a sandbox's root (an image) or its
/workspace seed (a template ``rootfs``), and the clean-up of what a killed broker left mounted."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Template
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import imageroot, overlay
from services.sandbox_broker.backends.bwrap import SandboxPaths
from services.sandbox_broker.backends.imageroot import ImageRoot
from services.sandbox_broker.images.sources import ImageError
from services.sandbox_broker.images.store import ImageStore

log = logging.getLogger(__name__)

WORKDIR = "/workspace"


class LocalImages:
    def __init__(self, state_dir: Path, sandboxes: Path, uid: int, budget_bytes: int) -> None:
        self.state_dir = state_dir
        self.sandboxes = sandboxes
        self.uid = uid
        self.store = ImageStore(state_dir / "images", uid, budget_bytes, in_use=self.in_use)

    def unpack(self, template: Template, use_overlay: bool) -> float:
        """Unpack the template's image (if not yet) before its sandbox's directory exists: a first
        unpack may outlast the reaper's grace for a sandbox without a lease, which would reap the
        sandbox being made. Returns the seconds spent unpacking."""
        if not template.image:
            return 0.0
        with _template_errors(template):
            return self.store.prepare(template.image, layered=use_overlay).prepare_s

    def prepare(self, paths: SandboxPaths, template: Template, use_overlay: bool, meta: dict[str, Any]) -> None:
        """Mount the template's image as the sandbox's root, or seed its /workspace from ``rootfs``."""
        with _template_errors(template):
            if template.image:
                image = self.store.prepare(template.image, layered=use_overlay)
                root = imageroot.mount_root(paths, image, self.uid, use_overlay, template.host_usr)
                meta["image"] = root.as_dict()
                meta["image_trees"] = list(image.layer_digests)
                meta["image_prepare_s"] = max(image.prepare_s, float(meta.get("image_prepare_s", 0.0)))
            elif template.rootfs:
                self._seed_workspace(paths, template.rootfs, use_overlay, meta)

    def _seed_workspace(self, paths: SandboxPaths, rootfs: str, use_overlay: bool, meta: dict[str, Any]) -> None:
        """A template ``rootfs`` directory is the initial content of /workspace (the host's /usr as
        root); it is kept in the image store like an image."""
        if not Path(rootfs).is_dir():
            raise ImageError(f"rootfs {rootfs} is not a directory")
        seed = self.store.prepare(str(Path(rootfs).resolve()))
        meta["rootfs_digest"] = seed.digest
        if use_overlay:
            upper, work = paths.root / "rw" / "upper", paths.root / "rw" / "work"
            for d in (upper, work):
                d.mkdir(parents=True, exist_ok=True)  # a fork's upper layer is already there
            overlay.chown_tree(upper, self.uid)
            overlay.mount(seed.rootfs, upper, work, paths.workspace)
        else:
            shutil.copytree(seed.rootfs, paths.workspace, symlinks=True, dirs_exist_ok=True)

    def in_use(self) -> set[str]:
        """Digests of the images and seeds this host's sandboxes use now."""
        used: set[str] = set()
        for meta_path in self.sandboxes.glob("*/meta.json"):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            used |= {*meta.get("image_trees", ()), meta.get("rootfs_digest")} - {None}
        return used

    def clean_leftovers(self) -> None:
        """What a broker killed mid-way (or an older version) left: half-unpacked
        images, the old per-rootfs copies, trees over budget. (Sandboxes, mounted or half-made, are
        the reaper's: it destroys those no lease accounts for.)"""
        legacy = self.state_dir / "layers"  # rootfs copies of older versions, never removed then
        if legacy.is_dir() and not overlay.mounts_under(legacy) and not _lower_in_use(legacy):
            shutil.rmtree(legacy, ignore_errors=True)
        self.store.clean()


@contextlib.contextmanager
def _template_errors(template: Template) -> Iterator[None]:
    try:
        yield
    except (ImageError, ValueError) as exc:
        raise PlatformError(ErrorCode.UNKNOWN_TEMPLATE, f"template {template.name!r}: {exc}",
                            field="template") from exc  # fmt: skip


def _lower_in_use(path: Path) -> bool:
    with open("/proc/self/mountinfo") as mountinfo:
        return any(str(path) in line for line in mountinfo)


def workdir_of(meta: dict[str, Any]) -> str:
    image = meta.get("image")
    return str(image["workdir"]) if image else WORKDIR


def shell_argv(command: str, meta: dict[str, Any]) -> list[str]:
    """``bash -lc`` on the host's /usr; in an image, ``bash -c`` (a login shell would reset the
    image's PATH from /etc/profile), or ``sh -c`` in an image without bash."""
    image = meta.get("image")
    if image is None:
        return ["/bin/bash", "-lc", command]
    return [image.get("shell") or "/bin/sh", "-c", command]


def image_of(meta: dict[str, Any]) -> ImageRoot | None:
    return ImageRoot.from_dict(meta["image"]) if "image" in meta else None


def read_meta(paths: SandboxPaths) -> dict[str, Any]:
    try:
        meta: dict[str, Any] = json.loads(paths.meta.read_text())
    except (OSError, ValueError):
        return {}
    return meta

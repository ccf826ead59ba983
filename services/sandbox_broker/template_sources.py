"""Where a template's sources may come from (an admin operation, checked at registration).

A ``rootfs`` must be a directory under one of ``template_roots``, after every symlink on the
way is resolved (``realpath``): a link inside a root that points out of it is refused, as is a
path that does not exist. The stored template carries the resolved path, so a link swapped in
later is not followed. An ``image`` must start with one of ``template_images`` when set.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Template
from services.protocol.status import ErrorCode


def _refuse(field: str, message: str) -> PlatformError:
    return PlatformError(ErrorCode.VALIDATION_ERROR, message, field=field)


def split_list(text: str, sep: str) -> list[str]:
    return [part.strip() for part in text.split(sep) if part.strip()]


def checked_source(field: str, path: str, roots: list[str], *, directory: bool) -> str:
    """The resolved path, when it lies inside a configured root; else a 400 naming ``field``."""
    if "\0" in path or not os.path.isabs(path):
        raise _refuse(field, f"{field} must be an absolute path")
    if not roots:
        raise _refuse(field, f"this broker accepts no host paths as {field} (ROLLOUT_BROKER_TEMPLATE_ROOTS is empty)")
    real = Path(os.path.realpath(path))
    if not any(real.is_relative_to(os.path.realpath(root)) for root in roots):
        raise _refuse(field, f"{field} must be inside one of the template roots (symlinks resolved)")
    if not (real.is_dir() if directory else real.exists()):
        raise _refuse(field, f"{field} {path} does not exist" + (" as a directory" if directory else ""))
    return str(real)


def checked_template(template: Template, backend: str, roots: str, images: str) -> Template:
    """``rootfs``, and an ``image`` given as a host path (an OCI layout, a tar, a directory) on the
    backends that read one (local; docker loads it into the engine)."""
    allowed = split_list(roots, ":")
    if template.rootfs is not None:
        template = template.model_copy(
            update={"rootfs": checked_source("rootfs", template.rootfs, allowed, directory=True)}
        )
    if backend in ("local", "docker") and template.image is not None and template.image.startswith("/"):
        template = template.model_copy(
            update={"image": checked_source("image", template.image, allowed, directory=False)}
        )
    prefixes = split_list(images, ",")
    if template.image is not None and prefixes and not any(template.image.startswith(p) for p in prefixes):
        raise _refuse("image", "image must come from one of the configured image stores (template_images)")
    return template

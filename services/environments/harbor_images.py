"""A Harbor task's ``environment/Dockerfile`` built offline with ``rollout images build``
(services/taskbuild/imagebuild.py): no registry, no daemon.

``FROM`` names a registry image this machine cannot pull; it resolves to a local base through a
mapping (:data:`DEFAULT_BASES`, overridden per image with ``--base IMAGE=BASE``, where BASE is an
image path, an image store name or ``mmdebstrap``). The default maps the Debian, Ubuntu and Python
images Terminal-Bench tasks start from to ``mmdebstrap`` (Debian 12 minbase with python3 3.11, git
and patch): ``RUN apt-get`` / ``pip`` then reach the registries at build time (``--network``).
Instructions a sandbox has no use for (``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``,
``HEALTHCHECK``, ``STOPSIGNAL``, ``VOLUME``) are dropped and reported; the others the builder does
not support (``ADD``, ``ARG``, multi-stage builds, ``COPY --from``) refuse the task.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.taskbuild import imagerecipe
from services.taskbuild.imagebuild import BuildOptions, build_image

DEFAULT_BASES = {
    "ubuntu:*": "mmdebstrap",
    "debian:*": "mmdebstrap",
    "python:*": "mmdebstrap",
    "ghcr.io/laude-institute/t-bench/*": "mmdebstrap",
}
DROPPED = ("CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "HEALTHCHECK", "STOPSIGNAL", "VOLUME", "MAINTAINER")


@dataclass
class BuiltImage:
    path: Path
    digest: str
    build_s: float
    notes: list[str] = field(default_factory=list)


def resolve_base(image: str, bases: dict[str, str]) -> str:
    """The local base for ``image``: an exact entry, else the first matching pattern; else refused."""
    if image in bases:
        return bases[image]
    for pattern, base in bases.items():
        if fnmatch.fnmatchcase(image, pattern):
            return base
    raise imagerecipe.RecipeError(f"FROM {image}: no local base for it (map one with --base {image}=PATH)")


def recipe_text(dockerfile: str, bases: dict[str, str]) -> tuple[str, list[str]]:
    """The Dockerfile with FROM resolved and the instructions a sandbox ignores taken out."""
    lines, notes = [], []
    for line in _logical_lines(dockerfile):
        words = line.split()
        keyword = words[0].upper() if words else ""
        if keyword == "FROM":
            if len(words) != 2:
                raise imagerecipe.RecipeError(f"{line!r}: FROM IMAGE only (no --platform, no AS stage)")
            lines.append(f"FROM {resolve_base(words[1], bases)}")
        elif keyword in DROPPED:
            notes.append(f"dropped {line!r} (a sandbox runs no entrypoint or service definition)")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n", notes


def _logical_lines(text: str) -> list[str]:
    """Instructions one per line (continuations joined), comments and blank lines left out."""
    out, pending = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        out.append(pending + stripped)
        pending = ""
    return out + ([pending.strip()] if pending.strip() else [])


def build(
    environment: Path, out: Path, cache: Path, bases: dict[str, str], *, network: bool = False,
    timeout_s: float = 600.0, store_names: dict[str, str] | None = None,
) -> BuiltImage:  # fmt: skip
    """Build ``environment/Dockerfile`` (its directory is the build context) into an OCI layout at
    ``out``; ``store_names`` resolves a base given as an image store name to its source."""
    text, notes = recipe_text((environment / "Dockerfile").read_text(), {**DEFAULT_BASES, **bases})
    recipe = imagerecipe.parse(text)
    options = BuildOptions(environment.resolve(), out.resolve(), cache, network=network, run_timeout_s=timeout_s,
                           resolve_base=store_names or {})  # fmt: skip
    started = time.monotonic()
    digest = build_image(recipe, options)
    return BuiltImage(out.resolve(), digest, time.monotonic() - started, notes)

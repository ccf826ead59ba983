"""The local sandboxes this broker process knows: each one's paths and its ``meta.json``, read once.

A sandbox's meta is written once, when it is created, and never changed; what changes is whether
the sandbox still exists. So a command reads the meta from memory and checks only that the file is
still there (one ``stat``): a sandbox destroyed by another replica on the same host, or by this one
under a running command, answers ``sandbox_died`` exactly as when the meta was read from disk each
time (``destroy`` removes the meta file first).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.sandbox_broker.backends.base import Sandbox, sandbox_gone
from services.sandbox_broker.backends.bwrap import SandboxPaths
from services.sandbox_broker.backends.cgroups import Cgroups
from services.sandbox_broker.backends.local_images import workdir_of

WORKDIR = "/workspace"

MAX_KNOWN = 100_000  # past this the memory starts over (a sandbox's meta is read again at its next command)


@dataclass(frozen=True, slots=True)
class KnownSandbox:
    paths: SandboxPaths
    meta: dict[str, Any]  # read-only: shared by every command of the sandbox
    meta_file: str

    def exists(self) -> bool:
        return os.path.isfile(self.meta_file)


class KnownSandboxes:
    def __init__(self) -> None:
        self._known: dict[str, KnownSandbox] = {}

    def __len__(self) -> int:
        return len(self._known)

    def add(self, sandbox_id: str, paths: SandboxPaths, meta: dict[str, Any]) -> KnownSandbox:
        if len(self._known) >= MAX_KNOWN:
            self._known.clear()
        known = self._known[sandbox_id] = KnownSandbox(paths, meta, str(paths.meta))
        return known

    def get(self, sandbox_id: str) -> KnownSandbox | None:
        """The sandbox if it is known here and still exists; None when it is not known here.
        Raises ``sandbox_died`` when it was known but is gone."""
        known = self._known.get(sandbox_id)
        if known is None:
            return None
        if not known.exists():
            del self._known[sandbox_id]
            raise sandbox_gone(sandbox_id)
        return known

    def peek(self, sandbox_id: str) -> KnownSandbox | None:
        """The sandbox if known here, without checking that it still exists."""
        return self._known.get(sandbox_id)

    def read(self, sandbox_id: str, paths: SandboxPaths) -> KnownSandbox:
        """Read a sandbox's meta from disk (one created by another replica, or before a restart)."""
        try:
            meta = json.loads(paths.meta.read_text())
        except FileNotFoundError:
            raise sandbox_gone(sandbox_id) from None
        return self.add(sandbox_id, paths, meta)

    def drop(self, sandbox_id: str) -> None:
        self._known.pop(sandbox_id, None)


def scan(root: Path, known_here: KnownSandboxes, cgroups: Cgroups) -> list[Sandbox]:
    """The sandboxes under ``root``, half-created ones and leftover cgroups included."""
    found = []
    for meta_path in root.glob("*/meta.json"):
        cached = known_here.peek(meta_path.parent.name)  # read at its create or first command here
        try:
            meta = cached.meta if cached is not None else json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        found.append(Sandbox(meta_path.parent.name, meta.get("labels", {}), workdir_of(meta),
                             meta.get("created_at", 0.0)))  # fmt: skip
    known = {s.sandbox_id for s in found}
    # half-created sandboxes (no meta yet) and leftover cgroups still count as ours; their age is
    # their directory's, so that the reaper's grace spares one that is being created right now
    extra = {p.name for p in root.iterdir() if p.name.startswith("loc-")} | set(cgroups.list_ids())
    found += [Sandbox(i, {}, WORKDIR, _age_stamp(root, cgroups, i)) for i in sorted(extra - known)]
    return found


def _age_stamp(root: Path, cgroups: Cgroups, sandbox_id: str) -> float:
    for path in (root / sandbox_id, *(p.parent for p in cgroups.procs_files(sandbox_id))):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0

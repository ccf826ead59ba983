"""What the docker backend keeps of a container's image config: where its commands start and the
user they run as (blocking Engine API calls, run in the backend's thread pool).

- ``WorkingDir``: a container starts in its image's working directory; an image without one gets
  ``/workspace`` (the engine creates it). Relative file paths and commands start there.
- ``Env``: the engine gives every exec the container's environment (the image's ``Env``), with
  the request's variables on top; nothing to do here.
- ``User``: the engine resolves an exec's user *by name* in the container's ``/etc/passwd`` as
  seen through its host-side mount of the container's root filesystem, not through the
  container's own mount namespace. When that mount is gone while the container still runs, every
  exec of an image whose ``User`` is a name (``root``) fails with exit 126 "unable to find user
  root: no matching entries in passwd file", the file routes included. A numeric ``uid:gid``
  needs no lookup, so a named user is resolved once, inside the container right after it
  started, and every exec passes the numbers.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode

DEFAULT_WORKDIR = "/workspace"

# the uid and gid of the exec's own process, from shell builtins only (any image with a sh)
_WHO = 'while read -r k v r; do case $k in Uid:) u=$v;; Gid:) g=$v;; esac; done < /proc/self/status; echo "$u:$g"'


@dataclass(frozen=True, slots=True)
class RunAs:
    """Where a container's commands start and who runs them (``user`` "" is the engine's default)."""

    workdir: str
    user: str

    def absolute(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))


def image_workdir(api: Any, image: str) -> str:
    """The image's ``WorkingDir``, or "" when it has none."""
    config = api.inspect_image(image).get("Config") or {}
    return str(config.get("WorkingDir") or "")


def numeric(user: str) -> bool:
    """Whether ``user`` ("uid", "uid:gid") names no one the engine must look up."""
    return all(part.isdigit() for part in user.split(":")) if user else True


def resolve(api: Any, container: str) -> RunAs:
    """The container's working directory and its exec user, a named user turned into ``uid:gid``."""
    config = api.inspect_container(container).get("Config") or {}
    workdir = str(config.get("WorkingDir") or DEFAULT_WORKDIR)
    user = str(config.get("User") or "")
    if numeric(user):
        return RunAs(workdir, user)
    exec_id = api.exec_create(container, ["sh", "-c", _WHO], workdir="/")["Id"]
    out = api.exec_start(exec_id).decode(errors="replace").strip()
    found = api.exec_inspect(exec_id).get("ExitCode")
    if found != 0 or not numeric(out) or ":" not in out:
        raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, f"cannot resolve the image's user {user!r}: "
                            f"exit {found}, {out[-200:]!r}")  # fmt: skip
    return RunAs(workdir, out)

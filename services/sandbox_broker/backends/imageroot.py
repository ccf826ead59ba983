"""A task image as the root filesystem of a local sandbox.

The image's unpacked tree (owned by the sandbox uid) is the read-only lower layer of a kernel
overlay mounted at ``<sandbox>/root``; the sandbox's writes go to its private upper layer under
``<sandbox>/rw`` (one directory, so a size-limited filesystem can be mounted there). Every command
is bubblewrap with that overlay as ``/``, run by the sandbox uid, which a user namespace maps to
the uid of the image's ``User`` (root by default, as SWE-bench images expect). The image's
``Env``, ``WorkingDir`` and ``User`` make the command's environment, start directory and identity.
The host's ``/usr`` is not visible unless the template asks for it (``host_usr``).
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.sandbox_broker.backends import overlay
from services.sandbox_broker.backends.base import bad_path
from services.sandbox_broker.backends.bwrap import HOST_SYMLINKS, SandboxPaths, privilege_drop
from services.sandbox_broker.images.store import PreparedImage

HOSTS = "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n"


@dataclass(frozen=True, slots=True)
class ImageRoot:
    """What a sandbox's commands need to know about its image (kept in its meta.json)."""

    digest: str
    uid: int  # inside the sandbox
    gid: int
    user: str
    home: str
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    host_usr: bool = False
    shell: str = "/bin/sh"  # /bin/bash where the image has it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageRoot:
        return cls(**raw)

    def base_env(self) -> dict[str, str]:
        env = {"HOME": self.home, "USER": self.user, "LANG": "C.UTF-8", "TERM": "dumb"}
        env.update(self.env)
        return env


def root_dir(paths: SandboxPaths) -> Path:
    return paths.root / "root"


def mount_root(paths: SandboxPaths, image: PreparedImage, uid: int, use_overlay: bool, host_usr: bool) -> ImageRoot:
    """Lay the image under the sandbox's private upper layer at ``<sandbox>/root``."""
    merged = root_dir(paths)
    merged.mkdir()
    if use_overlay:
        upper, work = paths.root / "rw" / "upper", paths.root / "rw" / "work"
        for d in (upper, work):
            d.mkdir(parents=True, exist_ok=True)
        _own(upper, uid)
        overlay.mount(":".join(str(layer) for layer in image.layers), upper, work, merged)
    else:  # no overlayfs here: a private copy of the flattened image
        shutil.copytree(image.rootfs, merged, symlinks=True, dirs_exist_ok=True)
    _prepare_tree(merged, uid)
    name, in_uid, gid, home = identity(merged, image.config.user)
    env = image.config.env_map()
    workdir = image.config.workdir or "/"
    found = [p for p in ("bin/bash", "usr/bin/bash") if (merged / p).exists()]
    shell = "/usr/bin/bash" if host_usr else "/" + found[0] if found else "/bin/sh"
    return ImageRoot(image.digest, in_uid, gid, name, env.pop("HOME", home), workdir, env, host_usr, shell)


def _prepare_tree(merged: Path, uid: int) -> None:
    """Mount points bwrap needs, a sticky /tmp, and this sandbox's /etc/hosts (in the upper layer)."""
    for name in ("proc", "dev", "tmp", "etc"):
        path = merged / name
        if not path.is_dir() and not path.is_symlink():
            path.mkdir()
            _own(path, uid)
    (merged / "tmp").chmod(0o1777)
    hosts = merged / "etc" / "hosts"
    if not hosts.is_symlink():
        hosts.write_text(HOSTS)
        _own(hosts, uid)


def identity(root: Path, user: str) -> tuple[str, int, int, str]:
    """(name, uid, gid, home) of an image ``User`` (name, uid, name:group, uid:gid), resolved in the
    image's own /etc/passwd and /etc/group."""
    name, _, group = (user or "root").partition(":")
    passwd = _table(root / "etc" / "passwd")
    entry = next((e for e in passwd if name in (e[0], e[2])), None)
    if entry is not None:
        login, uid, gid, home = entry[0], int(entry[2]), int(entry[3]), entry[5] or "/"
    elif name.isdigit():
        login, uid, gid, home = name, int(name), int(name), "/"
    else:
        raise ValueError(f"image user {name!r} is not in the image's /etc/passwd")
    if group:
        groups = _table(root / "etc" / "group")
        found = next((g for g in groups if group in (g[0], g[2])), None)
        gid = int(found[2]) if found else int(group) if group.isdigit() else gid
    if uid == 0 and home == "/":
        home = "/root"
    return login, uid, gid, home


def _table(path: Path) -> list[list[str]]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    rows = [line.split(":") for line in lines if line and not line.startswith("#")]
    return [r for r in rows if len(r) >= 3 and r[2].isdigit()]


def bwrap_image_argv(
    bwrap: str, paths: SandboxPaths, root: ImageRoot, *, uid: int, network: bool, cwd: str
) -> list[str]:
    """bwrap with the sandbox's overlay as ``/``: new user/pid/mount/ipc/uts (and net unless
    ``network``) namespaces, no capabilities, the image's user mapped onto the sandbox uid."""
    argv = privilege_drop(uid)
    argv += [bwrap, "--unshare-user", "--uid", str(root.uid), "--gid", str(root.gid)]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--disable-userns", "--hostname", "sandbox"]
    argv += ["--bind", str(root_dir(paths)), "/", "--proc", "/proc", "--dev", "/dev"]
    if root.host_usr:  # and the merged-/usr links where the image has no /lib, /bin, ...
        argv += ["--ro-bind", "/usr", "/usr"]
        for target, link in HOST_SYMLINKS:
            if not os.path.lexists(root_dir(paths) / link.lstrip("/")):
                argv += ["--symlink", target, link]
    if network:
        argv += ["--ro-bind-try", paths.resolv_conf(), "/etc/resolv.conf"]
    argv += ["--chdir", cwd]
    return argv


def host_path(paths: SandboxPaths, root: ImageRoot, path: str) -> Path:
    """The host path behind a sandbox path (relative paths start at the image's workdir),
    refusing one that resolves outside the sandbox's root."""
    inside = posixpath.normpath(posixpath.join(root.workdir, path))
    base = root_dir(paths)
    host = base / inside.lstrip("/")
    real, real_base = os.path.realpath(host), os.path.realpath(base)
    if real != real_base and not real.startswith(real_base + "/"):
        raise bad_path(path, "resolves outside the sandbox")
    return Path(real)


def _own(path: Path, uid: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, uid, uid, follow_symlinks=False)

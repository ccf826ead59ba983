"""Unpacking image layers.

``unpack_layer``: one layer into its own directory, whiteouts turned into overlayfs's own (a 0/0
character device for ``.wh.NAME``, the ``trusted.overlay.opaque`` xattr for ``.wh..wh..opq``), so
that the layers of every image stack as overlay lower directories, each unpacked once per layer
digest and shared by every image that has it (needs root, like the overlay mount itself).

``unpack``: every layer applied into one directory, as the OCI image spec says (``layer.md``):
``.wh.NAME`` deletes NAME, ``.wh..wh..opq`` empties its directory of what lower layers put there,
a non-directory replaces what was at its path, a directory merges into an existing one (used where
there is no overlayfs, for a private copy).

Extraction is faithful (``fully_trusted``: modes as recorded) with our own path checks instead:
no absolute names, no ``..``, never through a symlink. Device nodes are skipped (every sandbox
gets its own ``/dev``). The tree is then chowned to the sandbox uid, which owns every file of
every image (inside, the image's ``User`` is mapped onto it).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from services.sandbox_broker.images.sources import ImageError, ImageSource, layers

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def unpack(source: ImageSource, dest: Path) -> None:
    """Build the image's root filesystem in ``dest`` (created; must not exist)."""
    dest.mkdir(parents=True)
    dest.chmod(0o755)
    if source.kind == "dir":
        shutil.copytree(source.path, dest, symlinks=True, dirs_exist_ok=True)
        return
    with layers(source) as each:
        for layer in each:
            apply_layer(layer, dest)


def unpack_layer(layer: tarfile.TarFile, dest: Path) -> None:
    """One layer into ``dest`` (created) in overlayfs's format."""
    dest.mkdir(parents=True)
    dest.chmod(0o755)
    opaque: list[str] = []
    for kind, name, member in _entries(layer):
        if kind == "opaque":
            opaque.append(name)
        elif kind == "whiteout":
            target = _inside(dest, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            _remove(target)
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        else:
            _extract(layer, member, name, dest)
    for directory in opaque:
        host = _inside(dest, posixpath.join(directory, "x")).parent
        host.mkdir(parents=True, exist_ok=True)
        os.setxattr(host, "trusted.overlay.opaque", b"y", follow_symlinks=False)


def apply_layer(layer: tarfile.TarFile, root: Path) -> None:
    """One layer applied onto the tree at ``root`` (whiteouts delete from it)."""
    added: set[str] = set()
    opaque: list[str] = []
    for kind, name, member in _entries(layer):
        if kind == "opaque":
            opaque.append(name)
        elif kind == "whiteout":
            _remove(_inside(root, name))
        else:
            _extract(layer, member, name, root)
            added.add(name)
    for directory in opaque:
        _empty_except(root, directory, added)


def _entries(layer: tarfile.TarFile) -> Iterator[tuple[Literal["opaque", "whiteout", "entry"], str, tarfile.TarInfo]]:
    """The layer's members, checked and sorted out: ("opaque", the directory it empties),
    ("whiteout", the path it deletes), ("entry", its path); device nodes are left out."""
    for member in layer:
        name = _clean(member.name)
        if not name:
            continue
        parent, base = posixpath.split(name)
        if base == OPAQUE:
            yield "opaque", parent, member
        elif base.startswith(WHITEOUT):
            yield "whiteout", posixpath.join(parent, base[len(WHITEOUT) :]), member
        elif not (member.ischr() or member.isblk()):
            yield "entry", name, member


def _clean(name: str) -> str:
    name = posixpath.normpath(name.lstrip("/")) if name not in ("", ".", "./") else ""
    if name in (".", ""):
        return ""
    if name.startswith("../") or name == ".." or "/../" in name:
        raise ImageError(f"layer entry {name!r} leaves the root")
    return name


def _inside(root: Path, name: str) -> Path:
    """``root/name`` after checking that no directory on the way is a symlink."""
    path = root
    for part in Path(name).parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise ImageError(f"layer entry {name!r} goes through the symlink {part!r}")
    return root / name


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


def _extract(layer: tarfile.TarFile, member: tarfile.TarInfo, name: str, root: Path) -> None:
    target = _inside(root, name)
    exists = target.is_symlink() or target.exists()
    if exists and not (member.isdir() and target.is_dir() and not target.is_symlink()):
        _remove(target)
    if member.islnk():
        link = _clean(member.linkname)
        _inside(root, link)
        member = member.replace(linkname=link, deep=False)
    member = member.replace(name=name, deep=False)
    layer.extract(member, root, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def _empty_except(root: Path, directory: str, keep: set[str]) -> None:
    host = _inside(root, posixpath.join(directory, "x")).parent
    if not host.is_dir():
        return
    for child in host.iterdir():
        if posixpath.join(directory, child.name) not in keep:
            _remove(child)


def chown_tree(root: Path, uid: int) -> None:
    """Every file of ``root`` owned by ``uid`` (as root; a no-op otherwise)."""
    if os.geteuid() != 0:
        return
    os.chown(root, uid, uid, follow_symlinks=False)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(directory, name), uid, uid, follow_symlinks=False)


def tree_size(root: Path) -> int:
    """Bytes the tree takes on disk."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue
    return total

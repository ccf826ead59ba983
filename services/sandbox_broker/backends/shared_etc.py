"""The /etc a local sandbox sees, prepared once per broker and bound whole (one bind, not a dozen).

A sandbox's /etc holds a few of the host's files (``bwrap.HOST_ETC``: the dynamic loader's cache and
configuration, alternatives, the time zone, name-service switch, CA certificates, MIME types) and
its own passwd and group (an egress sandbox also its resolv.conf and hosts, pointing at its NAT, and
the host's gai.conf). bubblewrap bound each of those on its own, and every bind costs it a read of
the whole mount table (``launch_ns.py``): about 1.8 of a bubblewrap's 7 ms of CPU here.

Here they are copied once into ``<state>/etc/<digest>/`` (``plain`` and ``egress`` beside each other),
and a sandbox binds that directory read-only at /etc. The digest covers what was copied (each entry's
type, size, modification time and inode), so a host that changes one of its files gets a new
directory for the sandboxes made from then on (looked for at most every ``CHECK_EVERY_S``), and a
sandbox keeps the one it was made with (its meta's ``etc``). What the sandbox user could not read on
the host (not readable by others, such as /etc/ssl/private) is not copied. Symbolic links are copied
as links: they resolve inside the sandbox as they did through the binds (to the host's /usr); where
the state directory is on the host's filesystem, each is the host's link under a second name (``_link``).
Directories no live sandbox names are removed when the broker starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import threading
import time
from pathlib import Path

from services.sandbox_broker.backends import netns
from services.sandbox_broker.backends.bwrap import HOST_ETC

CHECK_EVERY_S = 1.0
WORKDIR = "/workspace"  # the sandbox user's home
KINDS = ("plain", "egress")
EGRESS_HOST_ETC = ("/etc/gai.conf",)  # an egress sandbox's resolver reads it too


def passwd(uid: int) -> str:
    """A sandbox's /etc/passwd (the shared copy's, and a sandbox's own file where it binds them one by one)."""
    return f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:{WORKDIR}:/bin/bash\n"


def group(uid: int) -> str:
    return f"root:x:0:\nsandbox:x:{uid}:\n"


def _readable(st: os.stat_result) -> bool:
    """What a user of no group of the file's could read (a directory: list and enter)."""
    need = stat.S_IROTH | stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else stat.S_IROTH
    return stat.S_ISLNK(st.st_mode) or st.st_mode & need == need


class SharedEtc:
    def __init__(self, root: Path, uid: int, host: Path = Path("/")) -> None:
        self.root = root  # <state>/etc
        self.uid = uid
        self.host = host  # the host's root (tests: another tree)
        self._lock = threading.Lock()  # creates prepare sandboxes in threads
        self._checked = -1.0
        self._current: Path | None = None

    def for_sandbox(self, network: str, own_namespace: bool) -> str | None:
        """What a new sandbox binds at /etc; None for an egress sandbox on the host's network (UNSAFE,
        ``--allow-unisolated``), whose resolv.conf and hosts are the host's, bound one by one."""
        if network == "egress" and not own_namespace:
            return None
        return str(self.path(egress=network == "egress"))

    def path(self, egress: bool) -> Path:
        """The directory to bind at /etc, as the host's files are now (built where it is new)."""
        with self._lock:
            now = time.monotonic()
            if self._current is None or now - self._checked >= CHECK_EVERY_S:
                entries = self._entries()  # one lstat each, read once for the digest and the copy
                self._current = self._build(self._signature(entries), entries)
                self._checked = now
            return self._current / KINDS[egress]

    def clean_unused(self, sandboxes: Path) -> list[Path]:
        """Remove the directories (and half-built ones) that no sandbox below ``sandboxes`` was made
        with (its ``meta.json``'s ``etc``): at the broker's start."""
        keep = set()
        for meta in sandboxes.glob("*/meta.json"):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                etc = json.loads(meta.read_text()).get("etc")
                if isinstance(etc, str):  # None: an egress sandbox on the host's network (its files one by one)
                    keep.add(Path(etc).parent)
        removed = []
        for entry in self.root.iterdir() if self.root.is_dir() else ():
            if entry not in keep:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        return removed

    def _entries(self) -> list[tuple[str, os.stat_result]]:
        found = []
        for name in (*HOST_ETC, *EGRESS_HOST_ETC):
            try:
                st = os.lstat(self.host / name.lstrip("/"))
            except OSError:
                continue
            found.append((name, st))
        return found

    def _signature(self, entries: list[tuple[str, os.stat_result]]) -> str:
        digest = hashlib.sha256(str(self.uid).encode())
        for name, st in entries:
            digest.update(f"{name}:{st.st_mode}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino};".encode())
        return digest.hexdigest()[:16]

    def _build(self, signature: str, entries: list[tuple[str, os.stat_result]]) -> Path:
        done = self.root / signature
        if done.is_dir():
            return done
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        building = self.root / f".{signature}-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(building, ignore_errors=True)
        for kind in KINDS:
            etc = building / kind
            etc.mkdir(parents=True)
            for name, st in entries:
                if name in EGRESS_HOST_ETC and kind != "egress":
                    continue
                self._copy(self.host / name.lstrip("/"), etc / Path(name).name, st)
            own = {"passwd": passwd(self.uid), "group": group(self.uid)}
            if kind == "egress":
                own.update({"resolv.conf": netns.RESOLV_CONF, "hosts": netns.HOSTS})
            for file, text in own.items():
                (etc / file).write_text(text)
                (etc / file).chmod(0o644)  # whatever the broker's umask
            etc.chmod(0o755)
        building.chmod(0o755)
        try:
            building.rename(done)
        except OSError:  # another thread or process built it meanwhile
            shutil.rmtree(building, ignore_errors=True)
        return done

    def _copy(self, source: Path, target: Path, st: os.stat_result) -> None:
        if not _readable(st):
            return
        if stat.S_ISDIR(st.st_mode):
            target.mkdir()
            with os.scandir(source) as entries:
                for entry in entries:
                    try:
                        found = entry.stat(follow_symlinks=False)
                    except OSError:  # gone meanwhile
                        continue
                    self._copy(Path(entry.path), target / entry.name, found)
            shutil.copystat(source, target)
        elif stat.S_ISLNK(st.st_mode):
            _link(source, target)
        else:  # a copy, not a link: a host file rewritten in place must not change a sandbox's /etc
            shutil.copy2(source, target, follow_symlinks=False)


def _link(source: Path, target: Path) -> None:
    """A symbolic link of the host's: the same link under a second name (a hard link to it) where both
    are on one filesystem, else a new link to the same place. Most of what is copied is links (the CA
    directory's hashes, /etc/alternatives: about 1,400 for the two kinds), and a hard link makes no
    inode: on this project's reference machine, whose root filesystem takes 0.3-1.3 ms to find a free
    inode while files come and go, the copy took 0.9 s of CPU at each broker's start. A link cannot be
    changed in place (the host replaces it), so a sandbox's /etc stays as it was made either way."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:  # another filesystem, or others' files may not be linked here (fs.protected_hardlinks)
        os.symlink(os.readlink(source), target)

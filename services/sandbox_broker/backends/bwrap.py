"""The bubblewrap command line of a local sandbox, and the probe of what the host allows."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from services.runtime.subprocess_pipes import close_pipes

log = logging.getLogger(__name__)

# host pieces every sandbox sees read-only: the programs and what bash/python need to start
HOST_RO = ("/usr",)
HOST_SYMLINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"))
HOST_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/mime.types",
)
SANDBOX_NET_ETC = ("resolv.conf", "hosts")  # written per sandbox (netns.py): DNS through slirp4netns only
BASE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
AGENTS_DIR = "/opt/agents"  # agent bundles (services.protocol.agents.AGENTS_DIR)
GATEWAY_DIR = "/run/rollout"  # where the lease's gateway socket is, inside (``GATEWAY_SOCKET``)


@dataclass(frozen=True, slots=True)
class SandboxPaths:
    """Where one local sandbox lives on the host."""

    root: Path

    @property
    def disk(self) -> Path:
        """Everything the sandbox can write lives here: its size-limited filesystem (disk.py)."""
        return self.root / "rw"

    @property
    def workspace(self) -> Path:
        return self.disk / "workspace"

    @property
    def tmp(self) -> Path:
        return self.disk / "tmp"

    @property
    def upper(self) -> Path:
        """The private writable layer over a template's root filesystem, and its work directory."""
        return self.disk / "upper"

    @property
    def work(self) -> Path:
        return self.disk / "work"

    @property
    def gateway(self) -> Path:
        """Bound read-only at /run/rollout: the lease's gateway socket appears here (gateway_forwarder.py)."""
        return self.root / "gateway"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def resolv_conf(self) -> str:
        """The sandbox's own resolv.conf (DNS through its NAT) when it has one, else the host's."""
        own = self.etc / "resolv.conf"
        return str(own) if own.is_file() else "/etc/resolv.conf"

    @property
    def meta(self) -> Path:
        return self.root / "meta.json"


def bwrap_argv(
    bwrap: str, paths: SandboxPaths, *, uid: int, network: bool, cwd: str, hostname: str = "sandbox",
    agents_dir: str | None = None, dropped: bool = False, etc: str | None = None,
) -> list[str]:  # fmt: skip
    """bwrap flags: new pid/mount/ipc/uts/user (and net unless ``network``) namespaces, no capabilities,
    the host's /usr read-only, a private /workspace and /tmp, the rest of / read-only.

    As root, bwrap itself is started as ``uid`` (setpriv), so the sandbox user is that unprivileged
    host uid, not root mapped into a user namespace; ``dropped``: its starter has dropped to ``uid``
    already (the zygote, agent_zygote.py), so no setpriv. ``etc``: a directory bound whole at /etc
    (shared_etc.py) instead of the host's files and the sandbox's own one by one."""
    argv = [] if dropped else privilege_drop(uid)
    argv += [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--disable-userns"]  # no nested user namespace: no capabilities to regain, less kernel to attack
    argv += ["--hostname", hostname]
    for path in HOST_RO:
        argv += ["--ro-bind", path, path]
    for target, link in HOST_SYMLINKS:
        argv += ["--symlink", target, link]
    if etc is not None:
        argv += ["--ro-bind", etc, "/etc"]
    else:
        argv += etc_binds(paths, network)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--bind", str(paths.workspace), "/workspace", "--bind", str(paths.tmp), "/tmp"]
    argv += ["--ro-bind-try", str(paths.gateway), GATEWAY_DIR]
    if agents_dir:
        argv += ["--ro-bind-try", agents_dir, AGENTS_DIR]
    argv += ["--remount-ro", "/", "--chdir", cwd]
    return argv


def etc_binds(paths: SandboxPaths, network: bool) -> list[str]:
    """The host's /etc files and the sandbox's own, one bind each (where no shared /etc is given)."""
    argv = []
    for path in HOST_ETC:
        argv += ["--ro-bind-try", path, path]
    own_etc = ("passwd", "group") + (SANDBOX_NET_ETC if network else ())
    for name in own_etc:
        argv += ["--ro-bind", str(paths.etc / name), f"/etc/{name}"]
    if network:
        argv += ["--ro-bind-try", "/etc/gai.conf", "/etc/gai.conf"]
    return argv


def privilege_drop(uid: int) -> list[str]:
    """As root, bwrap itself is started as ``uid`` with no capabilities (setpriv)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all"]  # fmt: skip


def limits_prefix(rlimits: dict[str, int], cgroup_procs: list[Path]) -> list[str]:
    """``sh -c`` that joins the sandbox's cgroups and sets rlimits, then execs the rest of argv."""
    lines = [f"echo $$ > {p}" for p in cgroup_procs]
    lines += [f"ulimit -{flag} {value}" for flag, value in rlimits.items()]
    lines.append('exec "$@"')
    return ["/bin/sh", "-c", "; ".join(lines), "sh"]


@dataclass(frozen=True, slots=True)
class HostProbe:
    """What isolation this host gives local sandboxes."""

    bwrap: str | None
    bwrap_version: str | None
    namespaces: bool  # bwrap ran a command in fresh namespaces with no capabilities
    cgroup: str  # "v1" | "v2" | "none": where resource limits come from besides rlimits
    detail: str = ""
    overlayfs: bool = False  # template root filesystems layered (else copied)

    @property
    def isolated(self) -> bool:
        return self.namespaces

    def as_dict(self) -> dict[str, object]:
        return {
            "isolated": self.isolated,
            "bwrap": self.bwrap_version,
            "namespaces": ["user", "pid", "mount", "ipc", "uts", "net"] if self.namespaces else [],
            "cap_drop_all": self.namespaces,
            "cgroup": self.cgroup,
            "rlimits": ["nofile", "fsize", "core"] + ([] if self.cgroup != "none" else ["as"]),
            "overlayfs": self.overlayfs,
            "detail": self.detail,
        }


async def probe_bwrap(paths: SandboxPaths, uid: int) -> tuple[str | None, str | None, bool, str]:
    """Run ``id -u`` in a sandbox laid out at ``paths``: (binary, version, worked, detail)."""
    binary = shutil.which("bwrap")
    if binary is None:
        return None, None, False, "bwrap not found (apt-get install bubblewrap)"
    version = await _output([binary, "--version"])
    argv = [*bwrap_argv(binary, paths, uid=uid, network=False, cwd="/workspace"), "/bin/sh", "-c", "id -u"]
    out = await _output(argv)
    ok = out.strip() == str(uid)
    detail = "" if ok else f"bwrap failed: {out.strip()[-300:]}"
    if "Permission denied" in out:
        detail += f" (every directory above {paths.root} must be searchable by uid {uid})"
    return binary, version.strip().split()[-1] if version else None, ok, detail


async def _output(argv: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)  # a loaded host is slow, not unable
    except TimeoutError:
        proc.kill()
        await proc.wait()
        close_pipes(proc)  # a process it started may still hold them
        return "timed out"
    return out.decode(errors="replace")

"""A local sandbox's directories on the host, laid out before its first process starts: the
writable workspace and /tmp, its own /etc files where it needs them, the gateway socket's directory, and an egress
sandbox's namespace behind NAT and rules (netns.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import netns, shared_etc
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.bwrap import SandboxPaths

# the host's addresses (denied to egress sandboxes) are read at most this often: an address the host
# gains is denied to the sandboxes made from then on within this long (the private, link-local and
# reserved ranges, where a host's own addresses mostly sit, are denied whatever it has)
HOST_NETWORKS_MAX_AGE_S = 2.0


def own(path: Path, uid: int) -> None:
    """Files the broker writes belong to the sandbox user (commands run as that uid)."""
    if os.geteuid() == 0:
        os.chown(path, uid, uid, follow_symlinks=False)


def layout(paths: SandboxPaths, uid: int, own_etc: bool) -> None:
    """``own_etc``: the sandbox's own /etc files too (gVisor binds them, an egress sandbox adds its
    resolv.conf and hosts); one that binds a shared /etc (shared_etc.py) gets them only where that
    copy is gone at a launch (:func:`own_etc_files`). Each file made on the host's filesystem costs
    a create and a delete per sandbox (more on an ext4 without a journal, whose inode allocator
    steps over the inodes freed in the last seconds)."""
    for d in (paths.workspace, paths.tmp, paths.gateway):
        d.mkdir(parents=True, exist_ok=True)
    paths.gateway.chmod(0o755)  # the sandbox user connects to the socket in it, writes nothing
    paths.tmp.chmod(0o1777)
    own(paths.workspace, uid)
    own(paths.tmp, uid)
    if own_etc:
        own_etc_files(paths, uid)


def own_etc_files(paths: SandboxPaths, uid: int) -> None:
    """The sandbox's passwd and group in its own /etc directory, bound one by one."""
    paths.etc.mkdir(exist_ok=True)
    for name, text in (("passwd", shared_etc.passwd(uid)), ("group", shared_etc.group(uid))):
        if not (paths.etc / name).is_file():
            (paths.etc / name).write_text(text)


def network(paths: SandboxPaths, spec: SandboxSpec, egress_problem: str, allow_unisolated: bool) -> bool:
    """Give an egress sandbox its own namespace behind NAT and rules (netns.py); whether it has one."""
    if egress_problem and not allow_unisolated:
        raise PlatformError(ErrorCode.BAD_REQUEST, f"egress sandboxes cannot be isolated on this broker's host "
                            f"({egress_problem})", field="network")  # fmt: skip
    if egress_problem:  # --allow-unisolated: the host's network (UNSAFE)
        for name in ("resolv.conf", "hosts"):
            shutil.copyfile(f"/etc/{name}", paths.etc / name)
        return False
    (paths.etc / "resolv.conf").write_text(netns.RESOLV_CONF)
    (paths.etc / "hosts").write_text(netns.HOSTS)
    host = netns.host_networks(max_age_s=HOST_NETWORKS_MAX_AGE_S)
    netns.open_namespace(paths.root, netns.ruleset(spec.template.egress_allow, host))
    return True

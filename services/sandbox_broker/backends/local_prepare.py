"""A local sandbox's directories on the host, laid out before its first process starts: the
writable workspace and /tmp, its own /etc files, the gateway socket's directory, and an egress
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


def layout(paths: SandboxPaths, uid: int) -> None:
    for d in (paths.workspace, paths.tmp, paths.etc, paths.gateway):
        d.mkdir(parents=True, exist_ok=True)
    paths.gateway.chmod(0o755)  # the sandbox user connects to the socket in it, writes nothing
    paths.tmp.chmod(0o1777)
    own(paths.workspace, uid)
    own(paths.tmp, uid)
    (paths.etc / "passwd").write_text(shared_etc.passwd(uid))
    (paths.etc / "group").write_text(shared_etc.group(uid))


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

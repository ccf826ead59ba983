"""How a local sandbox's command is started: its environment, and the command line that puts it in
the sandbox (limits and cgroups, the egress namespace, bubblewrap or gVisor), whether for one command or for
the sandbox's exec agent."""

from __future__ import annotations

import os
from typing import Any

from services.protocol.sandboxes import ExecRequest
from services.sandbox_broker.backends import imageroot, local_prepare, netns
from services.sandbox_broker.backends.bwrap import BASE_PATH, SandboxPaths, bwrap_argv, limits_prefix
from services.sandbox_broker.backends.gvisor import Runsc
from services.sandbox_broker.backends.local_images import image_of, shell_argv, workdir_of

WORKDIR = "/workspace"
HOST_PYTHON = "/usr/bin/python3"  # the exec agent's interpreter: the host's, where the sandbox sees its /usr
AGENT_ENV = {"PATH": BASE_PATH, "LANG": "C.UTF-8"}
CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000  # setns(2)'s flags


def command_of(request: ExecRequest, meta: dict[str, Any]) -> list[str]:
    return request.argv if request.argv is not None else shell_argv(request.shell or "", meta)


def env_of(request: ExecRequest, meta: dict[str, Any]) -> dict[str, str]:
    image = image_of(meta)
    env = image.base_env() if image else {"PATH": BASE_PATH, "HOME": WORKDIR, "USER": "sandbox",
                                          "LANG": "C.UTF-8", "TERM": "dumb"}  # fmt: skip
    env.update(request.env)
    return env


def cwd_of(request: ExecRequest, meta: dict[str, Any]) -> str:
    return request.cwd or workdir_of(meta)


def sandbox_prefix(bwrap: str, paths: SandboxPaths, meta: dict[str, Any], *, uid: int, cwd: str,
                   cgroup_procs: list[Any], mount_ns: str | None = None) -> list[str]:  # fmt: skip
    """Everything before the command: join the cgroups and set rlimits, enter the egress namespace
    and the launch namespace (``mount_ns``: launch_ns.py), then bubblewrap (with the image as root
    where the sandbox has one)."""
    image = image_of(meta)
    network = meta.get("network") == "egress"
    if image is not None:
        argv = imageroot.bwrap_image_argv(bwrap, paths, image, uid=uid, network=network, cwd=cwd)
    else:
        argv = bwrap_argv(bwrap, paths, uid=uid, network=network, cwd=cwd, agents_dir=meta.get("agents_dir"),
                          etc=shared_etc_of(meta, paths, uid))  # fmt: skip
    enter = netns.enter_prefix(paths.root) if meta.get("netns") else ["nsenter"] if mount_ns else []
    if mount_ns:  # one nsenter: it opens every namespace's path (the egress one's too) in the broker's
        enter.append(f"--mount={mount_ns}")
    return [*limits_prefix(meta.get("rlimits", {}), cgroup_procs), *enter, *argv]


def zygote_launch(bwrap: str, paths: SandboxPaths, meta: dict[str, Any], *, uid: int, cwd: str,
                  cgroup_procs: list[Any], mount_ns: str | None) -> tuple[list[str], dict[str, object]]:  # fmt: skip
    """What the zygote starts for a sandbox (agent_zygote.Zygote.launch): bubblewrap's command line
    without setpriv, and what ``sandbox_prefix``'s shell, nsenter and setpriv did before it, as data."""
    network = meta.get("network") == "egress"
    argv = bwrap_argv(bwrap, paths, uid=uid, network=network, cwd=cwd, agents_dir=meta.get("agents_dir"), dropped=True,
                      etc=shared_etc_of(meta, paths, uid))  # fmt: skip
    namespaces = [(str(netns.ns_file(paths.root)), CLONE_NEWNET)] if meta.get("netns") else []
    if mount_ns:  # the egress namespace's file is opened first, from the broker's own mount namespace
        namespaces.append((mount_ns, CLONE_NEWNS))
    launch: dict[str, object] = {"procs": [str(p) for p in cgroup_procs], "rlimits": meta.get("rlimits", {}),
                                 "namespaces": namespaces, "uid": uid, "sandbox": paths.root.name}  # fmt: skip
    return argv, launch


def gvisor_argv(runsc: Runsc, paths: SandboxPaths, meta: dict[str, Any], *, uid: int, cwd: str,
                env: dict[str, str], command: list[str], cgroup_procs: list[Any], name: str) -> list[str]:  # fmt: skip
    """The command in gVisor (gvisor.py): join the cgroups (no host rlimits: gVisor enforces the
    bundle's), enter the egress namespace, then ``runsc run``."""
    argv = runsc.argv(paths, meta, uid=uid, cwd=cwd, env=env, command=command, name=name)
    if meta.get("netns"):
        argv = [*netns.enter_prefix(paths.root), *argv]
    return [*limits_prefix({}, cgroup_procs), *argv]


def shared_etc_of(meta: dict[str, Any], paths: SandboxPaths, uid: int) -> str | None:
    """The shared /etc the sandbox was made with (shared_etc.py), while it is there; else None: its
    files one by one (a sandbox made before it existed, or one whose copy is gone: its own passwd
    and group are written now, as ``local_prepare.layout`` did not)."""
    etc = meta.get("etc")
    if isinstance(etc, str) and os.path.isdir(etc):
        return etc
    if isinstance(etc, str):
        local_prepare.own_etc_files(paths, uid)
    return None


def agent_python(meta: dict[str, Any]) -> str | None:
    """The interpreter the sandbox's exec agent runs on, or None (an image without the host's /usr:
    its commands start a bubblewrap each)."""
    image = image_of(meta)
    return HOST_PYTHON if image is None or image.host_usr else None

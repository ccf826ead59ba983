"""``isolation: "gvisor"`` on the local backend: a sandbox's commands run in gVisor (``runsc``), a
user-space kernel between them and the host's, instead of bubblewrap's namespaces.

Each start (the sandbox's exec agent, or a command of its own) is ``runsc run`` of an OCI bundle
written for it under the sandbox's directory. gVisor's /proc lets a process open the descriptors of
another of the same uid although it is not dumpable, so the agent runs as gVisor's root with
CAP_SETUID, CAP_SETGID and CAP_KILL only (inside gVisor), and starts each command as the sandbox
uid, which then cannot reach the agent's pipes to the broker; an image sandbox (whose user may be
root) gets no agent.
The bundle binds the host directories a bubblewrap binds: the host's ``/usr`` read-only (or the
image's overlay as ``/``), ``/workspace`` and ``/tmp`` on the sandbox's size-limited disk, its own
``/etc/passwd``, the gateway socket's directory and the agent bundles read-only. The command runs
as the sandbox uid (an image's user) with no capabilities and no new privileges; rlimits (open
files, file size, processes) are set in the bundle and enforced by gVisor's kernel. On the host,
runsc joins the sandbox's cgroups first, so its memory, CPU and pids limits hold the whole gVisor
sandbox (sentry and gofer included), and dies with the broker (``--pdeathsig``). Network: ``none``
is gVisor's own loopback only; ``egress`` is ``--network=host`` inside the sandbox's egress
namespace (netns.py): gVisor's own network stack cannot start on a host whose root network
namespace it cannot read. Files the broker writes on the host are seen inside
(``--file-access=shared``). Each run's container state lives under the sandbox's directory and
goes with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.runtime.subprocess_pipes import close_pipes
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.backends import imageroot
from services.sandbox_broker.backends.bwrap import (
    AGENTS_DIR,
    GATEWAY_DIR,
    HOST_ETC,
    HOST_SYMLINKS,
    SANDBOX_NET_ETC,
    SandboxPaths,
)
from services.sandbox_broker.backends.local_images import image_of

PIDS_FACTOR = 8  # host pids per guest process allowed (ptrace platform: stubs and threads; docker.py)
PROBE_TIMEOUT_S = 60.0
AGENT = "agent"  # the exec agent's start (local.py): root inside gVisor, dropping each command's uid
AGENT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL")
CLONE_NEWUSER = 0x10000000
# applied by gVisor's kernel to the sandbox's processes (``--oci-seccomp``): no new user namespace, in
# which a process would hold capabilities (as bubblewrap's --disable-userns and docker's profile)
NO_NEW_NAMESPACES = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
         "args": [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}]},
    ],
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Runsc:
    """The runsc binary and the flags every start gets."""

    binary: str
    version: str
    platform: str = "ptrace"

    def argv(self, paths: SandboxPaths, meta: dict[str, Any], *, uid: int, cwd: str, env: dict[str, str],
             command: list[str], name: str) -> list[str]:  # fmt: skip
        """``runsc run`` of a bundle written now for ``command`` (under the sandbox, named ``name``)."""
        bundle = bundles_dir(paths) / f"{name}-{secrets.token_hex(4)}"
        bundle.mkdir(parents=True, mode=0o700)
        spec = bundle_spec(paths, meta, uid=uid, cwd=cwd, env=env, command=command, agent=name == AGENT)
        (bundle / "config.json").write_text(json.dumps(spec))
        egress = meta.get("network") == "egress"
        flags = [f"--root={state_dir(paths)}", f"--platform={self.platform}", "--file-access=shared", "--host-uds=open",
                 "--oci-seccomp", f"--network={'host' if egress else 'none'}", "--ignore-cgroups"]  # fmt: skip
        return ["setpriv", "--pdeathsig", "KILL", self.binary, *flags, "run", "--bundle", str(bundle), bundle.name]


def state_dir(paths: SandboxPaths) -> Path:
    return paths.root / "runsc"


def bundles_dir(paths: SandboxPaths) -> Path:
    return state_dir(paths) / "bundles"


def done_with(argv: list[str]) -> None:
    """Remove the bundle of a finished run (its container state went with it)."""
    if "--bundle" in argv:
        shutil.rmtree(argv[argv.index("--bundle") + 1], ignore_errors=True)


def bundle_spec(paths: SandboxPaths, meta: dict[str, Any], *, uid: int, cwd: str, env: dict[str, str],
                command: list[str], agent: bool = False) -> dict[str, Any]:  # fmt: skip
    """The OCI runtime spec of one start (``agent``: the exec agent, gVisor's root with only the
    capabilities it needs to start each command as ``uid`` and to end what it leaves)."""
    image = image_of(meta)
    rlimits = meta.get("rlimits", {})
    limits = [("RLIMIT_NOFILE", rlimits.get("n")), ("RLIMIT_FSIZE", _bytes(rlimits.get("f"), 512)),
              ("RLIMIT_AS", _bytes(rlimits.get("v"), 1024)), ("RLIMIT_NPROC", meta.get("gvisor_nproc"))]  # fmt: skip
    user = {"uid": image.uid, "gid": image.gid} if image else {"uid": uid, "gid": uid, "additionalGids": []}
    caps: list[str] = []
    if agent:
        user, caps = {"uid": 0, "gid": 0, "additionalGids": []}, list(AGENT_CAPS)
    process: dict[str, Any] = {
        "terminal": False, "user": user, "args": command, "cwd": cwd,
        "env": [f"{k}={v}" for k, v in env.items()], "noNewPrivileges": True,
        "capabilities": {"bounding": caps, "effective": caps, "inheritable": [], "permitted": caps, "ambient": []},
        "rlimits": [{"type": kind, "hard": value, "soft": value} for kind, value in limits if value],
    }  # fmt: skip
    network = meta.get("network") == "egress"
    if image is not None:
        root = {"path": str(imageroot.root_dir(paths)), "readonly": False}
        mounts = _image_mounts(paths, image.host_usr, network)
    else:
        mounts = _plain_mounts(paths, network, meta.get("agents_dir"))
        mounts.append(_bind(str(paths.gateway), GATEWAY_DIR, ro=True))
        root = {"path": str(_plain_root(paths, mounts)), "readonly": True}
    mounts.insert(0, {"destination": "/proc", "type": "proc", "source": "proc"})
    kinds = ("pid", "ipc", "uts", "mount") + (() if network else ("network",))  # egress: runsc's own (netns.py)
    namespaces = [{"type": kind} for kind in kinds]
    return {"ociVersion": "1.0.2", "process": process, "root": root, "hostname": "sandbox", "mounts": mounts,
            "linux": {"namespaces": namespaces, "seccomp": NO_NEW_NAMESPACES}}  # fmt: skip


def _bytes(value: int | None, unit: int) -> int | None:
    return value * unit if value else None


def _bind(source: str, destination: str, ro: bool) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": source, "options": ["rbind", "ro" if ro else "rw"]}


def _plain_root(paths: SandboxPaths, mounts: list[dict[str, Any]]) -> Path:
    """A read-only ``/`` of mount points and the merged-/usr links: everything else is mounted on it."""
    root = state_dir(paths) / "rootfs"
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        for target, link in HOST_SYMLINKS:
            (root / link.lstrip("/")).symlink_to(target)
        (root / "proc").mkdir()
    for mount in mounts:
        point = root / mount["destination"].lstrip("/")
        if not point.exists():
            point.parent.mkdir(parents=True, exist_ok=True)
            if os.path.isdir(mount["source"]):
                point.mkdir(exist_ok=True)
            else:
                point.touch()
    return root


def _plain_mounts(paths: SandboxPaths, network: bool, agents_dir: str | None) -> list[dict[str, Any]]:
    mounts = [_bind("/usr", "/usr", ro=True)]
    mounts += [_bind(path, path, ro=True) for path in HOST_ETC if os.path.exists(path)]
    own = ("passwd", "group") + (SANDBOX_NET_ETC if network else ())
    mounts += [_bind(str(paths.etc / name), f"/etc/{name}", ro=True) for name in own]
    if network and os.path.exists("/etc/gai.conf"):
        mounts.append(_bind("/etc/gai.conf", "/etc/gai.conf", ro=True))
    mounts += [_bind(str(paths.workspace), "/workspace", ro=False), _bind(str(paths.tmp), "/tmp", ro=False)]
    if agents_dir and os.path.isdir(agents_dir):
        mounts.append(_bind(agents_dir, AGENTS_DIR, ro=True))
    return mounts


def _image_mounts(paths: SandboxPaths, host_usr: bool, network: bool) -> list[dict[str, Any]]:
    mounts = []
    if host_usr:
        mounts.append(_bind("/usr", "/usr", ro=True))
        for target, link in HOST_SYMLINKS:
            if not os.path.lexists(imageroot.root_dir(paths) / link.lstrip("/")):
                mounts.append(_bind("/" + target, link, ro=True))
    if network:
        mounts.append(_bind(paths.resolv_conf(), "/etc/resolv.conf", ro=True))
    return mounts


class GvisorLevel:
    """Whether this broker's local sandboxes can have gVisor. Where runsc is installed and the broker
    is root, a sandbox is started in the background at the broker's start (about 0.5 s); the first
    gVisor sandbox waits for it, and ``levels["gvisor"]`` (``/healthz``) then says why not, if not."""

    def __init__(self) -> None:
        self.runsc: Runsc | None = None
        self.problem = "not probed"
        self._probe: asyncio.Task[None] | None = None

    def start(self, state: Path, uid: int, levels: dict[str, str]) -> None:
        self.problem = missing()
        levels["gvisor"] = self.problem
        if not self.problem:
            self._probe = asyncio.get_running_loop().create_task(self._run(state, uid, levels))

    async def _run(self, state: Path, uid: int, levels: dict[str, str]) -> None:
        self.runsc, self.problem = await probe(state, uid)
        levels["gvisor"] = self.problem

    async def ready(self) -> Runsc:
        """runsc, once probed; a 422 naming ``isolation`` where this host cannot run gVisor."""
        if self._probe is not None:
            await asyncio.shield(self._probe)
        if self.runsc is None:
            raise PlatformError(ErrorCode.VALIDATION_ERROR, f"isolation 'gvisor' is unavailable on this broker's "
                                f"host: {self.problem}", field="isolation")  # fmt: skip
        return self.runsc

    async def close(self) -> None:
        await cancel_and_wait(self._probe)


def missing() -> str:
    """Why gVisor cannot be tried here at all ('' when it can)."""
    if shutil.which("runsc") is None:
        return "runsc not found (apt-get install runsc)"
    if os.geteuid() != 0:
        return "runsc needs the broker to run as root"
    return ""


async def probe(state: Path, uid: int) -> tuple[Runsc | None, str]:
    """Run ``id -u`` in gVisor, laid out as a sandbox under ``state``: (runsc, "") or (None, why not)."""
    binary = shutil.which("runsc")
    if binary is None or missing():
        return None, missing()
    version = (await _output([binary, "--version"]))[1].split("\n")[0].split()[-1:]
    runsc = Runsc(binary, version[0] if version else "unknown")
    paths = SandboxPaths(state)
    for d in (paths.workspace, paths.tmp, paths.etc, paths.gateway):
        d.mkdir(parents=True, exist_ok=True)
    for name in ("passwd", "group"):
        (paths.etc / name).write_text("")
    argv = runsc.argv(paths, {}, uid=uid, cwd="/workspace", env={"PATH": "/usr/bin:/bin"},
                      command=["/usr/bin/id", "-u"], name="probe")  # fmt: skip
    try:
        code, out = await _output(argv)
    finally:
        await asyncio.to_thread(shutil.rmtree, state, True)
    if code == 0 and out.strip() == str(uid):
        return runsc, ""
    return None, f"runsc could not start a sandbox here (exit {code}): {out.strip()[-300:]}"


async def _output(argv: list[str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
    except BaseException as exc:  # timed out, or the broker stopping
        proc.kill()
        await proc.wait()
        close_pipes(proc)  # a process it started may still hold them
        if not isinstance(exc, TimeoutError):
            raise
        return -1, "timed out"
    return proc.returncode or 0, out.decode(errors="replace")

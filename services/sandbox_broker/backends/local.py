"""The ``local`` backend: each sandbox is a directory on this host, each command a fresh bubblewrap
process in new namespaces over it (no network unless asked, no capabilities, a non-root uid),
limited by cgroup v1 or rlimits. A template with an ``image`` gets that image as its root
filesystem (``imageroot``); one without sees the host's /usr read-only and a private /workspace
and /tmp.

A sandbox lives on disk (``<state_dir>/sandboxes/<id>``), so another replica on the same host, or
this one after a restart, finds it again by id; nothing runs between commands.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import GATEWAY_SOCKET, ExecRequest, ExecResult
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import (
    disk,
    gvisor,
    leftovers,
    local_files,
    local_prepare,
    netns,
    overlay,
    snapshots,
)
from services.sandbox_broker.backends.agents import AgentRequest, ExecAgent, ExecAgents, agent_command, stub
from services.sandbox_broker.backends.base import OutputSink, Sandbox, SandboxSpec, bad_path, sandbox_gone
from services.sandbox_broker.backends.bwrap import HostProbe, SandboxPaths, probe_bwrap
from services.sandbox_broker.backends.cgroups import Cgroups
from services.sandbox_broker.backends.create_phases import PhaseClock
from services.sandbox_broker.backends.gateway_forwarder import GatewayForwarders, relay_command
from services.sandbox_broker.backends.launch_ns import LaunchNamespace, launching
from services.sandbox_broker.backends.leftovers import remove_sandbox
from services.sandbox_broker.backends.local_commands import (
    AGENT_ENV,
    HOST_PYTHON,
    agent_python,
    command_of,
    cwd_of,
    env_of,
    gvisor_argv,
    sandbox_prefix,
    zygote_launch,
)
from services.sandbox_broker.backends.local_images import LocalImages, image_of, workdir_of
from services.sandbox_broker.backends.local_known import KnownSandboxes, scan
from services.sandbox_broker.backends.process import run_process, watch_children_with_pidfds
from services.sandbox_broker.backends.shared_etc import SharedEtc
from services.sandbox_broker.backends.zygote_client import AgentZygote
from services.sandbox_broker.settings import BrokerSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

WORKDIR = "/workspace"


class LocalBackend:
    name = "local"

    def __init__(self, settings: BrokerSettings) -> None:
        state_dir = settings.state_dir.resolve()  # mount points are absolute: a relative dir left them mounted
        self.root = state_dir / "sandboxes"
        self.images = LocalImages(state_dir, self.root, settings.sandbox_uid, settings.image_store_mb * 2**20)
        self.uid = settings.sandbox_uid
        self.nofile = settings.nofile
        self.pids_max = settings.pids_max
        self.allow_unisolated = settings.allow_unisolated
        self.max_output_bytes = settings.max_output_bytes
        self.setup_timeout_s = settings.setup_timeout_s
        self.cgroups = Cgroups("none")
        self.probe = HostProbe(None, None, False, "none")
        self.overlay = False
        self.disk_quota = False  # each sandbox's writable state on a loop-mounted, size-limited ext4
        self.disks = disk.DiskImages(state_dir / disk.TEMPLATES, settings.sandbox_uid)
        self.egress_problem = "not probed"  # '' when egress sandboxes get their own isolated namespace
        self._bwrap: str | None = None
        forks = settings.agent_zygote and os.geteuid() == 0  # it enters the sandboxes' namespaces: root only
        self.agents = ExecAgents(AgentZygote(HOST_PYTHON, AGENT_ENV) if forks else None)
        root = os.geteuid() == 0  # it mounts: root only
        self.launch = LaunchNamespace(self.root, HOST_PYTHON) if settings.launch_namespace and root else None
        self.use_agents = settings.exec_agents
        self.known = KnownSandboxes()
        self.agents_dir = str(settings.agents_dir.resolve()) if settings.agents_dir else None
        self.gateways = GatewayForwarders()
        self.gvisor = gvisor.GvisorLevel()
        self.phases = PhaseClock()  # where cold creates go (create_phases.py; the broker's /metrics)
        self.etc = SharedEtc(self.root.parent / "etc", self.uid)  # the /etc each sandbox binds whole

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        watch_children_with_pidfds()
        self.root.mkdir(parents=True, exist_ok=True)
        for directory in (self.root.parent, self.root):
            directory.chmod(0o711)  # the sandbox uid passes through, lists nothing
        await asyncio.to_thread(leftovers.clean_after_brokers, self.root.parent)
        await asyncio.to_thread(snapshots.clean, self.root.parent)
        await asyncio.to_thread(self.images.clean_leftovers)
        await asyncio.to_thread(self.disks.clean_leftovers)
        await asyncio.to_thread(disk.thaw_all, self.root)  # a snapshot cut short by a kill -9
        await asyncio.to_thread(self.etc.clean_unused, self.root)
        self.cgroups = await asyncio.to_thread(Cgroups.probe, self.pids_max, Cgroups.scope_of(self.root))
        local_prepare.layout(paths := SandboxPaths(self.root.parent / "probe"), self.uid, own_etc=True)
        binary, version, ok, detail = await probe_bwrap(paths, self.uid)
        await asyncio.to_thread(shutil.rmtree, paths.root, True)
        state, pid = self.root.parent, os.getpid()
        self.overlay = await asyncio.to_thread(overlay.probe, leftovers.probe_dir(state, "overlay", pid))
        self.disk_quota = await asyncio.to_thread(disk.probe, leftovers.probe_dir(state, "disk", pid))
        self.egress_problem = await asyncio.to_thread(netns.probe, leftovers.probe_dir(state, "netns", pid))
        self.probe = HostProbe(binary, version, ok, self.cgroups.mode, detail, self.overlay)
        self._bwrap = binary if ok else None
        if not ok and not self.allow_unisolated:
            raise RuntimeError(f"local sandboxes cannot be isolated on this host ({detail}); "
                               "pass --allow-unisolated to run commands without isolation (UNSAFE)")  # fmt: skip
        if not ok:
            log.warning("UNSAFE: local sandboxes run WITHOUT isolation: %s", detail)
        elif self.launch is not None:
            self.launch.start()
        levels = {"namespaces": "" if ok else detail}  # what a lease's isolation may ask for ("": available)
        self.gvisor.start(leftovers.probe_dir(state, "gvisor", pid), self.uid, levels)
        found = {**self.probe.as_dict(), "unsafe_unisolated": not ok, **self._limits_probe()}
        found["isolation_levels"] = levels
        log.info("local backend host probe: %s", found)
        return found

    def _limits_probe(self) -> dict[str, str]:
        if self.egress_problem:
            fallback = ", or run UNSAFE on the host network (--allow-unisolated)" if self.allow_unisolated else ""
            log.warning("egress sandboxes cannot be isolated here (%s): egress leases are refused%s",
                        self.egress_problem, fallback)  # fmt: skip
        egress = f"unavailable: {self.egress_problem}" if self.egress_problem else netns.KIND
        launch = "off" if self.launch is None else self.launch.problem or "own mount namespace (launch_ns.py)"
        return {"disk_quota": disk.KIND if self.disk_quota else "none (file-size rlimit only)", "egress": egress,
                "launch_namespace": launch}  # fmt: skip

    async def close(self) -> None:
        await self.gvisor.close()
        await self.gateways.close()
        await self.agents.close()
        if self.launch is not None:
            self.launch.close()
        await asyncio.to_thread(self.cgroups.remove_scope)
        await asyncio.to_thread(self.images.clean_leftovers)

    # -- sandboxes -----------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox_id = "loc-" + secrets.token_hex(8)
        paths = self._paths(sandbox_id)
        meta: dict[str, object] = {"labels": spec.labels, "network": spec.network, "created_at": time.time(),
                                   "agents_dir": self.agents_dir}  # fmt: skip
        if spec.isolation_level == "gvisor":  # else bubblewrap's namespaces (an older sandbox has no "isolation")
            await self.gvisor.ready()
            meta.update(isolation="gvisor", gvisor_nproc=self.pids_max)
        try:
            text = await asyncio.to_thread(self._prepare, paths, spec, meta)
            self.known.add(sandbox_id, paths, json.loads(text))  # as its commands would read it back
            with self.phases.phase("agent"):
                await self._start_agent(sandbox_id, paths, meta)
            for command in spec.template.setup if spec.clone_of is None else ():  # a clone has its result
                request = ExecRequest(shell=command, timeout_s=self.setup_timeout_s)
                with self.phases.phase("setup"):
                    result = await self.exec(sandbox_id, request)
                if result.exit_code != 0:
                    raise PlatformError(
                        ErrorCode.SANDBOX_CREATE_FAILED,
                        f"template setup {command!r} exited {result.exit_code}: {result.stderr[-500:]}",
                    )
        except BaseException:
            await self.destroy(sandbox_id)
            raise
        return Sandbox(sandbox_id, spec.labels, workdir_of(meta), float(str(meta["created_at"])),
                       float(str(meta.get("cloned_s", 0.0))))  # fmt: skip

    async def bind_gateway(self, sandbox_id: str, session: str, upstream: str, ttl_s: float) -> None:
        """Serve the sandbox's gateway socket, relaying ``/e/{session}/...`` only (gateway_forwarder.py)."""
        known = self.known.get(sandbox_id) or self.known.read(sandbox_id, self._paths(sandbox_id))
        if image_of(known.meta) is not None:
            raise PlatformError(ErrorCode.BAD_REQUEST, "the gateway socket is not bound into image sandboxes yet",
                                field="template")  # fmt: skip
        await self.gateways.bind(sandbox_id, known.paths.gateway, session, upstream, ttl_s)

    def route_task(self, sandbox_id: str, task_lease: str, broker: str) -> None:
        """A paired agent's sandbox: its forwarder also relays ``/leases/{task_lease}/...`` to the broker."""
        self.gateways.route_task(sandbox_id, task_lease, broker)

    async def snapshot(self, sandbox_id: str) -> str:
        paths = self._existing(sandbox_id)  # with a disk quota: its whole image, the filesystem frozen meanwhile
        return await asyncio.to_thread(snapshots.take, paths.disk, self.root.parent,
                                       disk.image(paths.root) if self.disk_quota else None)  # fmt: skip

    async def drop_snapshot(self, snapshot_id: str) -> None:
        await asyncio.to_thread(snapshots.drop, snapshot_id, self.root.parent)

    def _prepare(self, paths: SandboxPaths, spec: SandboxSpec, meta: dict[str, object]) -> str:
        """Lay the sandbox out on disk (one worker thread's call: each costs a hand-over); its meta as
        written. The image is unpacked before the sandbox's directory exists."""
        meta["image_prepare_s"] = self._timed("image", self.images.unpack, spec.template, self.overlay)
        paths.root.mkdir(parents=True)
        started = time.monotonic()  # a clone: before any overlay is mounted over the copied upper layer
        source = snapshots.image_of(spec.clone_of, self.root.parent, self.disk_quota)  # a clone's disk
        if self.disk_quota:  # first: the workspace, /tmp and an image's upper layer all live on it
            self._timed("disk", self.disks.create, paths.root, paths.disk, spec.resources.disk_mb, source)
        if spec.clone_of is not None:
            if source is None:  # a tree
                snapshots.restore(spec.clone_of, self.root.parent, paths.disk)
            meta["cloned_s"] = time.monotonic() - started
        gvisor_level = meta.get("isolation") == "gvisor"  # it binds the sandbox's own /etc files; egress adds two
        self._timed("layout", local_prepare.layout, paths, self.uid, spec.network == "egress" or gvisor_level)
        if spec.network == "egress":
            meta["netns"] = self._timed("egress", local_prepare.network, paths, spec, self.egress_problem,
                                        self.allow_unisolated)  # fmt: skip
        meta["etc"] = self.etc.for_sandbox(spec.network, bool(meta.get("netns")))
        self._timed("overlay", self.images.prepare, paths, spec.template, self.overlay, meta)
        gvisor_pids = self.pids_max * gvisor.PIDS_FACTOR if gvisor_level else None
        self._timed("cgroup", self.cgroups.create, paths.root.name, spec.resources, gvisor_pids)
        rlimits = {"n": self.nofile, "f": spec.resources.disk_mb * 2048, "c": 0}  # 512-byte blocks; no core dumps
        if self.cgroups.mode == "none":
            rlimits["v"] = spec.resources.memory_mb * 1024
        meta["rlimits"] = rlimits
        text = json.dumps(meta)
        paths.meta.write_text(text)
        return text

    def _timed(self, phase: str, step: Callable[..., T], *args: Any) -> T:
        with self.phases.phase(phase):
            return step(*args)

    async def alive(self, sandbox_id: str) -> bool:
        paths = self._paths(sandbox_id)
        return paths.meta.is_file() and paths.workspace.is_dir() and self.cgroups.exists(sandbox_id)

    async def keepalive(self, sandbox_id: str, ttl_s: float) -> None:
        return None

    async def destroy(self, sandbox_id: str) -> None:
        paths = self._paths(sandbox_id)
        paths.meta.unlink(missing_ok=True)  # first: a command cut short now reports the sandbox gone
        self.known.drop(sandbox_id)
        await self.gateways.unbind(sandbox_id)
        await self.agents.stop(sandbox_id)
        await asyncio.to_thread(remove_sandbox, self.cgroups, sandbox_id, paths)

    async def list_sandboxes(self) -> list[Sandbox]:
        return await asyncio.to_thread(scan, self.root, self.known, self.cgroups)

    # -- commands ------------------------------------------------------------------------------

    async def exec(self, sandbox_id: str, request: ExecRequest, sink: OutputSink | None = None) -> ExecResult:
        known = self.known.get(sandbox_id) or self.known.read(sandbox_id, self._paths(sandbox_id))
        paths, meta = known.paths, known.meta
        if request.keep_background:
            why = "local commands run in their own pid namespace: their processes always end with them"
            raise PlatformError(ErrorCode.BAD_REQUEST, why, field="keep_background")
        command, cwd, env = command_of(request, meta), cwd_of(request, meta), env_of(request, meta)
        if request.gateway_port is not None:  # the in-sandbox end of the lease's gateway forwarder
            command = relay_command(agent_python(meta) or "python3", request.gateway_port, GATEWAY_SOCKET, command)
        cap = min(request.max_output_bytes, self.max_output_bytes)
        agent = self.agents.take(sandbox_id)
        if agent is None:
            await self._start_agent(sandbox_id, paths, meta, wait=False)  # for the next ones (a broker restart)

        def alone() -> asyncio.Future[ExecResult]:  # a bubblewrap of its own, as before agents
            return asyncio.ensure_future(
                self._exec_alone(sandbox_id, paths, meta, request, command, cwd, env, cap, sink)
            )

        if agent is None:
            result = await alone()
        else:
            user = (self.uid, self.uid) if meta.get("isolation") == "gvisor" else None  # the agent is root there
            asked = AgentRequest(command, env, cwd, request.stdin, request.timeout_s, cap, user)
            result = await self.agents.run(agent, asked, sink, alone)
        if not known.exists():  # destroyed under the command (reaped, released): not a result
            self.known.drop(sandbox_id)
            raise sandbox_gone(sandbox_id)
        return result

    async def _exec_alone(self, sandbox_id: str, paths: SandboxPaths, meta: dict[str, Any], request: ExecRequest,
                          command: list[str], cwd: str, env: dict[str, str], cap: int,
                          sink: OutputSink | None) -> ExecResult:  # fmt: skip
        async with launching(self._launch_ns(meta), paths.root, brief=False) as mount_ns:
            if self._bwrap is None and meta.get("isolation") != "gvisor":  # --allow-unisolated, no bwrap: UNSAFE
                argv, host_cwd = command, str(self._unisolated_cwd(paths, cwd))
            else:
                argv, host_cwd = await self._argv(sandbox_id, paths, meta, cwd, env, command, "cmd", mount_ns), None
            try:
                return await run_process(
                    argv, env=env, timeout_s=request.timeout_s, max_output_bytes=cap,
                    stdin=request.stdin.encode() if request.stdin is not None else None, cwd=host_cwd, sink=sink,
                    on_timeout=lambda: self._kill_all(sandbox_id),
                )  # fmt: skip
            finally:
                gvisor.done_with(argv)

    def _launch_ns(self, meta: dict[str, Any]) -> LaunchNamespace | None:
        """Where a bubblewrap of the sandbox starts (launch_ns.py); None: the broker's own namespace."""
        return self.launch if self._bwrap is not None and meta.get("isolation") != "gvisor" else None

    async def _argv(self, sandbox_id: str, paths: SandboxPaths, meta: dict[str, Any], cwd: str, env: dict[str, str],
                    command: list[str], name: str, mount_ns: str | None = None) -> list[str]:  # fmt: skip
        """The command line that runs ``command`` in the sandbox: bubblewrap, or gVisor (gvisor.py)."""
        procs = self.cgroups.procs_files(sandbox_id)
        if meta.get("isolation") == "gvisor":
            runsc = await self.gvisor.ready()
            return await asyncio.to_thread(gvisor_argv, runsc, paths, meta, uid=self.uid, cwd=cwd, env=env,
                                           command=command, cgroup_procs=procs, name=name)  # fmt: skip
        assert self._bwrap is not None
        prefix = sandbox_prefix(self._bwrap, paths, meta, uid=self.uid, cwd=cwd, cgroup_procs=procs, mount_ns=mount_ns)
        return [*prefix, *command]

    async def _start_agent(self, sandbox_id: str, paths: SandboxPaths, meta: dict[str, Any], wait: bool = True) -> None:
        """The sandbox's exec agent, started with it (or at its first command after a broker restart)."""
        python = agent_python(meta)
        # gVisor: its /proc lets a process open the descriptors of another of the same uid (it does
        # not honour PR_SET_DUMPABLE), so there the agent is gVisor's root (CAP_SETUID, CAP_SETGID,
        # CAP_KILL and nothing else, inside gVisor only) and drops each command to the sandbox uid;
        # an image's user may be root: no agent there
        gvisor_level = meta.get("isolation") == "gvisor"
        if (gvisor_level and image_of(meta) is not None) or (self._bwrap is None and not gvisor_level) \
                or python is None or not self.use_agents:  # fmt: skip
            return
        await self.agents.ensure(sandbox_id, lambda: self._new_agent(sandbox_id, paths, meta, python), wait)

    async def _new_agent(self, sandbox_id: str, paths: SandboxPaths, meta: dict[str, Any], python: str) -> ExecAgent:
        workdir, log_path, zygote = workdir_of(meta), paths.root / "agent.log", self.agents.zygote
        async with launching(self._launch_ns(meta), paths.root, brief=True) as mount_ns:  # until it is up
            if zygote is not None and meta.get("isolation") != "gvisor" and image_of(meta) is None:  # agent_zygote.py
                assert self._bwrap is not None
                argv, launch = zygote_launch(self._bwrap, paths, meta, uid=self.uid, cwd=workdir, mount_ns=mount_ns,
                                             cgroup_procs=self.cgroups.procs_files(sandbox_id))  # fmt: skip
                await zygote.start()
                return await ExecAgent.fork(zygote, [*argv, *stub(meta.get("rlimits", {}))], AGENT_ENV, log_path,
                                            launch, workdir)  # fmt: skip
            command = agent_command(python)
            argv = await self._argv(sandbox_id, paths, meta, workdir, AGENT_ENV, command, "agent", mount_ns)
            return await ExecAgent.start(argv, AGENT_ENV, log_path)

    def _kill_all(self, sandbox_id: str) -> None:
        if killed := self.cgroups.kill(sandbox_id):
            log.info("timeout in %s: killed %d processes left in its cgroups", sandbox_id, killed)

    def _unisolated_cwd(self, paths: SandboxPaths, cwd: str) -> Path:
        try:
            return local_files.host_path(paths, cwd)
        except PlatformError:
            return paths.workspace

    # -- files ---------------------------------------------------------------------------------

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        paths = self._existing(sandbox_id)
        host = local_files.host_path(paths, path)
        try:
            await asyncio.to_thread(local_files.write_owned, paths, host, data, self.uid)
        except (IsADirectoryError, NotADirectoryError, FileExistsError):
            raise bad_path(path, "is a directory, or a file stands where a directory must be") from None

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        host = local_files.host_path(self._existing(sandbox_id), path)
        try:
            return await asyncio.to_thread(local_files.read_host_file, host)
        except FileNotFoundError:
            raise PlatformError(ErrorCode.NOT_FOUND, f"no file {path!r} in the sandbox") from None
        except IsADirectoryError:
            raise bad_path(path, "is a directory") from None

    async def put_archive(self, sandbox_id: str, directory: str, tar: bytes) -> None:
        host = local_files.host_path(self._existing(sandbox_id), directory)
        await asyncio.to_thread(local_files.extract_tar, host, tar)
        await asyncio.to_thread(overlay.chown_tree, host, self.uid)

    async def get_archive(self, sandbox_id: str, directory: str) -> bytes:
        host = local_files.host_path(self._existing(sandbox_id), directory)
        if not host.is_dir():
            raise PlatformError(ErrorCode.NOT_FOUND, f"no directory {directory!r} in the sandbox")
        return await asyncio.to_thread(local_files.pack_tar, host)

    def _existing(self, sandbox_id: str) -> SandboxPaths:
        paths = self._paths(sandbox_id)
        if not paths.meta.is_file():
            raise sandbox_gone(sandbox_id)
        return paths

    def _paths(self, sandbox_id: str) -> SandboxPaths:
        if "/" in sandbox_id or sandbox_id in ("", ".", ".."):
            raise sandbox_gone(sandbox_id)
        return SandboxPaths(self.root / sandbox_id)

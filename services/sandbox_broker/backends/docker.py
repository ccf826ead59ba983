"""The ``docker`` backend: containers through the Docker Engine API (dockerd, podman's compatible
socket) with the ``docker`` SDK, run in a thread pool since the SDK blocks.

One shared bridge network (inter-container traffic off) for leases that ask for egress, no network
at all otherwise; labels on every container; ``init``; CPU, memory and pids limits; no
capabilities; images are never pulled here (prepare them first). Docker has no exec timeout and no
exec kill, so each command runs under ``timeout -k`` inside and a client-side deadline outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, ExecResult
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import (
    docker_agents,
    docker_config,
    docker_disk,
    docker_firewall,
    docker_images,
    docker_sweep,
    dockerfiles,
)
from services.sandbox_broker.backends.base import (
    LABEL_BROKER,
    OutputBuffer,
    OutputSink,
    Sandbox,
    SandboxSpec,
    sandbox_gone,
)
from services.sandbox_broker.backends.docker_config import DEFAULT_WORKDIR, RunAs
from services.sandbox_broker.backends.gateway_forwarder import GatewayForwarders
from services.sandbox_broker.backends.monitors import leftover_monitors
from services.sandbox_broker.images.sources import ImageError
from services.sandbox_broker.settings import BrokerSettings

log = logging.getLogger(__name__)

# the container's command, marked like every exec so that no exec's sweep takes it for a leftover: the
# sweep also spares the lowest pid after init, but an exec that starts before docker-init has forked
# this command gets the lower pid, and its sweep then killed the keep-alive, docker-init exited and
# the kernel killed everything in the container (a setup command exiting 137 after it had finished)
KEEP_RUNNING = ["sh", "-c", f"{docker_sweep.MARK} the container's keep-alive\nwhile :; do sleep 2147483647; done"]
KILL_GRACE_S = 2  # timeout -k: SIGKILL this long after SIGTERM
CLIENT_SLACK_S = 10.0  # the client-side deadline: the inner timeout plus this
TIMEOUT_CODES = (124, 137, 143)
# gVisor (runsc) on its ptrace platform runs host stub processes for the guest's address spaces:
# about 50 host pids idle and about 4 more per guest process started (measured, runsc 20221219), so
# the container's host pids limit is this many times ``pids_max`` there. At 512 the sentry itself
# could not start a thread and the sandbox died ("error initializing first thread").
GVISOR_PIDS_FACTOR = 8  # timeout(1) exit codes: GNU, after -k, busybox on SIGTERM


class DockerBackend:
    name = "docker"

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.max_output_bytes = settings.max_output_bytes
        self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="docker")
        self._client: Any = None
        self._firewalled: str | None = None  # the sandbox bridge whose iptables rules this broker owns
        self._loading: dict[str, asyncio.Lock] = {}  # image path -> one load at a time
        self._disk = docker_disk.DiskQuota(False, docker_disk.NONE)  # what start() found
        self._run_as: dict[str, RunAs] = {}  # container id -> its workdir and exec user (docker_config.py)
        self.agents = docker_agents.DockerAgents(settings)  # gateway socket, bundles, host /usr mounts
        self.gateways = GatewayForwarders()

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    @property
    def client(self) -> Any:
        if self._client is None:
            raise PlatformError(ErrorCode.BACKEND_UNAVAILABLE, "docker backend not started")
        return self._client

    async def start(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_pool_size": 256, "timeout": 120}
        if self.settings.docker_host:
            kwargs["base_url"] = self.settings.docker_host
        self._client = (
            await self._run(docker.DockerClient, **kwargs)
            if "base_url" in kwargs
            else await self._run(lambda: docker.from_env(**kwargs))
        )
        version = await self._run(self._client.version)
        self._disk = docker_disk.probe(await self._run(self._client.info), self.settings.docker_disk_quota)
        bridge = await self._run(self._ensure_network)
        if self.settings.docker_firewall:
            await self._run(docker_firewall.install, bridge)
            self._firewalled = bridge
        image = self.settings.docker_image
        has_image = await self._run(self._has_image, image)
        if not has_image:
            log.warning("image %s is not on the docker host; prepare it (the broker never pulls)", image)
        return {"isolated": True, "engine": version.get("Version"), "api": version.get("ApiVersion"),
                "network": self.settings.docker_network, "default_image": image, "default_image_present": has_image,
                "runtime": self.settings.docker_runtime or "default", "bridge": bridge,
                "firewall": "iptables" if self._firewalled else "operator (docs/sandbox_broker.md)",
                "disk_quota": self._disk.detail, "host_paths": self.agents.enabled,
                "agent_bundles": bool(self.agents.enabled and self.agents.agents_dir),
                "isolation_levels": self._levels()}  # fmt: skip

    def _levels(self) -> dict[str, str]:
        """What a lease's ``isolation`` may ask for: the engine's runtime decides, for every sandbox."""
        if self.settings.docker_runtime == "runsc":
            return {"gvisor": "", "namespaces": "the docker runtime is runsc (gVisor) for every sandbox"}
        return {"namespaces": "", "gvisor": "the docker runtime is not runsc (ROLLOUT_BROKER_DOCKER_RUNTIME=runsc "
                "with an engine configured for it)"}  # fmt: skip

    def _remove_idle_network(self) -> None:
        """On shutdown, the shared network goes when no sandbox is left on it (another replica's
        sandboxes keep it; the next broker to start creates it again)."""
        for network in self._client.networks.list(names=[self.settings.docker_network]):
            network.reload()
            if network.attrs.get("Labels", {}).get(LABEL_BROKER) == "shared" and not network.attrs.get("Containers"):
                with contextlib.suppress(docker.errors.APIError):  # a sandbox joined meanwhile
                    network.remove()

    def _ensure_network(self) -> str:
        """The shared egress network (created with inter-container traffic off); its bridge's name."""
        name = self.settings.docker_network
        found = self._client.networks.list(names=[name])
        if found:
            network = found[0]
            network.reload()
        else:
            options = {"com.docker.network.bridge.enable_icc": "false"}
            if self.settings.docker_bridge:
                options["com.docker.network.bridge.name"] = self.settings.docker_bridge
            network = self._client.networks.create(name, driver="bridge", labels={LABEL_BROKER: "shared"},
                                                   options=options)  # fmt: skip
            network.reload()
        bridge: str = network.attrs.get("Options", {}).get("com.docker.network.bridge.name") or f"br-{network.id[:12]}"
        return bridge

    def _has_image(self, image: str) -> bool:
        try:
            self._client.images.get(image)
            return True
        except docker.errors.ImageNotFound:
            return False

    async def close(self) -> None:
        await self.gateways.close()
        if self._firewalled:
            await self._run(docker_firewall.remove, self._firewalled)
        if self._client is not None:
            await self._run(self._remove_idle_network)
            await self._run(self._client.close)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- sandboxes -----------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        image = await self._image(spec.template.image or self.settings.docker_image)
        if not await self._run(self._has_image, image):
            raise PlatformError(ErrorCode.UNKNOWN_TEMPLATE, f"image {image} is not on the docker host "
                                "(prepare it first: the broker never pulls)", field="template")  # fmt: skip
        mounts = self.agents.mounts(spec.template, gateway := self.agents.new_dir())
        try:
            container = await self._run(self._start_container, image, spec, mounts)
        except BaseException:
            self.agents.forget("", gateway)
            raise
        self.agents.remember(container.id, gateway)
        try:
            if spec.template.host_usr:
                await self._run(docker_agents.link_usr, self.client.api, container.id)
            run_as = await self._resolve(container.id)
            sandbox = Sandbox(container.id, spec.labels, run_as.workdir, time.time())
            for command in spec.template.setup:
                result = await self.exec(
                    container.id, ExecRequest(shell=command, timeout_s=self.settings.setup_timeout_s)
                )
                if result.exit_code != 0:
                    message = f"template setup {command!r} exited {result.exit_code}: {result.stderr[-500:]}"
                    raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, message)
        except BaseException:
            await self.destroy(container.id)
            raise
        return sandbox

    async def _image(self, image: str) -> str:
        """The image to run: a host path (an image source, as on the local backend) is loaded into
        the engine first (docker_images.py); a name is used as it is (never pulled)."""
        if not docker_images.is_path(image):
            return image
        async with self._loading.setdefault(image, asyncio.Lock()):
            try:
                loaded: str = await self._run(docker_images.ensure_loaded, self.client.api, image)
            except (ImageError, docker.errors.APIError) as exc:
                raise PlatformError(ErrorCode.UNKNOWN_TEMPLATE, f"image {image}: {exc}", field="template") from exc
        return loaded

    def _start_container(self, image: str, spec: SandboxSpec, mounts: list[Any]) -> Any:
        r = spec.resources
        network: dict[str, Any] = (
            {"network": self.settings.docker_network} if spec.network == "egress" else {"network_mode": "none"}
        )
        kwargs: dict[str, Any] = {
            "command": KEEP_RUNNING, "detach": True, "labels": spec.labels, "init": True,
            "nano_cpus": int(r.cpus * 1e9), "mem_limit": f"{r.memory_mb}m", "memswap_limit": f"{r.memory_mb}m",
            "pids_limit": _pids_limit(self.settings), "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"],
            "ulimits": [docker.types.Ulimit(name="nofile", soft=self.settings.nofile, hard=self.settings.nofile),
                        docker.types.Ulimit(name="core", soft=0, hard=0)],  # no core dumps (local.py)
            "tmpfs": {"/tmp": f"rw,nosuid,size={min(r.disk_mb, 1024)}m"}, **network, **self._disk.options(r.disk_mb),
        }  # fmt: skip
        if self.settings.docker_runtime:
            kwargs["runtime"] = self.settings.docker_runtime
        if mounts:
            kwargs["mounts"] = mounts
        try:
            if not docker_config.image_workdir(self._client.api, image):  # else the image's WorkingDir
                kwargs["working_dir"] = DEFAULT_WORKDIR
            container = self._client.containers.create(image, **kwargs)
        except docker.errors.APIError as exc:
            raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, f"container create: {exc}") from exc
        try:
            container.start()
        except docker.errors.APIError as exc:  # do not leave it in "Created"
            container.remove(force=True)
            raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, f"container start: {exc}") from exc
        return container

    async def alive(self, sandbox_id: str) -> bool:
        try:
            info = await self._run(self.client.api.inspect_container, sandbox_id)
        except docker.errors.NotFound:
            return False
        return bool(info["State"]["Running"])

    async def keepalive(self, sandbox_id: str, ttl_s: float) -> None:
        return None

    async def destroy(self, sandbox_id: str) -> None:
        self._run_as.pop(sandbox_id, None)
        await self.gateways.unbind(sandbox_id)
        gateway = self.agents.dir_of(sandbox_id, None)
        try:
            if gateway is None and self.agents.enabled:
                gateway = self.agents.dir_of(sandbox_id, await self._run(self.client.api.inspect_container, sandbox_id))
            await self._run(self.client.api.remove_container, sandbox_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        self.agents.forget(sandbox_id, gateway)

    async def bind_gateway(self, sandbox_id: str, session: str, upstream: str, ttl_s: float) -> None:
        """Serve the container's gateway socket, relaying ``/e/{session}/...`` only (docker_agents.py)."""
        if not self.agents.enabled:
            raise self.agents.refuse("the gateway forwarder", "gateway")
        gateway = self.agents.dir_of(sandbox_id, None)
        if gateway is None:
            try:
                gateway = self.agents.dir_of(sandbox_id, await self._run(self.client.api.inspect_container, sandbox_id))
            except docker.errors.NotFound:
                raise sandbox_gone(sandbox_id) from None
        if gateway is None:
            raise PlatformError(ErrorCode.BAD_REQUEST, f"sandbox {sandbox_id} has no gateway directory (created "
                                "before this broker forwarded gateways)", field="gateway")  # fmt: skip
        await self.gateways.bind(sandbox_id, gateway, session, upstream, ttl_s)

    def route_task(self, sandbox_id: str, task_lease: str, broker: str) -> None:
        """A paired agent's container: its forwarder also relays ``/leases/{task_lease}/...`` to the broker."""
        self.gateways.route_task(sandbox_id, task_lease, broker)

    async def list_sandboxes(self) -> list[Sandbox]:
        containers = await self._run(  # one removed meanwhile is left out (it failed the whole orphan pass)
            self.client.containers.list, all=True, filters={"label": LABEL_BROKER}, ignore_removed=True
        )
        found = [Sandbox(c.id, dict(c.labels), _workdir(c.attrs), _created(c.attrs.get("Created", "")))
                 for c in containers]  # fmt: skip
        if self.settings.docker_exec_root:  # the containers are listed after /proc is read (monitors.py)

            def every() -> set[str]:
                return {c["Id"] for c in self.client.api.containers(all=True)}

            await self._run(leftover_monitors, self.settings.docker_exec_root, every, True)
        return found

    # -- commands ------------------------------------------------------------------------------

    async def exec(self, sandbox_id: str, request: ExecRequest, sink: OutputSink | None = None) -> ExecResult:
        """Runs under the sweep wrapper (docker_sweep.py): the command's processes end with it."""
        command = request.argv if request.argv is not None else ["sh", "-c", request.shell or ""]
        env = dict(request.env)
        if request.stdin is not None:  # the SDK's exec has no stdin without a raw socket: pipe it from env
            env["ROLLOUT_STDIN"] = request.stdin
            command = ["sh", "-c", 'printf %s "$ROLLOUT_STDIN" | "$@"', "sh", *command]
        if request.gateway_port is not None:  # the in-container end of the lease's gateway forwarder
            if not self.agents.enabled:
                raise self.agents.refuse("an exec with gateway_port", "gateway")
            command = docker_agents.relayed(request.gateway_port, command)
        timeout = max(1, round(request.timeout_s + 0.499))
        argv = docker_sweep.wrap(["timeout", "-k", str(KILL_GRACE_S), str(timeout), *command], env,
                                 request.keep_background)  # fmt: skip
        limit = min(request.max_output_bytes, self.max_output_bytes)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            run_as = await self._resolve(sandbox_id)
            job = loop.run_in_executor(self._pool, dockerfiles.run_exec, self.client.api, sandbox_id, argv, env,
                                       request.cwd or run_as.workdir, run_as.user, limit, sink, loop)  # fmt: skip
            code, out, err = await asyncio.wait_for(job, request.timeout_s + KILL_GRACE_S + CLIENT_SLACK_S)
        except TimeoutError:
            log.warning("exec in %s passed its client deadline; reporting a timeout", sandbox_id[:12])
            code, out, err = 124, OutputBuffer(0), OutputBuffer(0)
        except docker.errors.NotFound:
            raise sandbox_gone(sandbox_id) from None
        except docker.errors.APIError as exc:
            if "is not running" in str(exc):
                raise sandbox_gone(sandbox_id) from exc
            raise PlatformError(ErrorCode.TRANSPORT_ERROR, f"docker exec: {exc}") from exc
        duration = time.monotonic() - started
        timed_out = code in TIMEOUT_CODES and duration >= request.timeout_s
        return ExecResult(exit_code=124 if timed_out else code, stdout=out.text(), stderr=err.text(),
                          stdout_truncated=out.truncated, stderr_truncated=err.truncated, timed_out=timed_out,
                          duration_s=duration)  # fmt: skip

    # -- files ---------------------------------------------------------------------------------

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        await self._files(dockerfiles.write_file, sandbox_id, path, data)

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        data: bytes = await self._files(dockerfiles.read_file, sandbox_id, path)
        return data

    async def put_archive(self, sandbox_id: str, directory: str, tar: bytes) -> None:
        await self._files(dockerfiles.put_archive, sandbox_id, directory, tar)

    async def get_archive(self, sandbox_id: str, directory: str) -> bytes:
        data: bytes = await self._files(dockerfiles.get_archive, sandbox_id, directory)
        return data

    async def _resolve(self, sandbox_id: str) -> RunAs:
        """The container's workdir and exec user: kept from its creation, else read once (a
        container created before this broker started)."""
        found = self._run_as.get(sandbox_id)
        if found is None:
            found = self._run_as[sandbox_id] = await self._run(docker_config.resolve, self.client.api, sandbox_id)
        return found

    async def _files(self, fn: Any, sandbox_id: str, *args: Any) -> Any:
        try:
            run_as = await self._resolve(sandbox_id)
            return await self._run(fn, self.client.api, sandbox_id, run_as, *args)
        except docker.errors.NotFound as exc:
            if "No such container" in str(exc):
                raise sandbox_gone(sandbox_id) from exc
            why = exc.explanation or str(exc)  # the engine's words: which path or object it could not find
            raise PlatformError(ErrorCode.NOT_FOUND, f"not found in the sandbox: {args[0]!r} ({why})") from exc
        except docker.errors.APIError as exc:
            if "is not running" in str(exc):
                raise sandbox_gone(sandbox_id) from exc
            raise PlatformError(ErrorCode.TRANSPORT_ERROR, f"docker: {exc}") from exc


def _pids_limit(settings: BrokerSettings) -> int:
    gvisor = (settings.docker_runtime or "").startswith("runsc")
    return settings.pids_max * GVISOR_PIDS_FACTOR if gvisor else settings.pids_max


def _workdir(attrs: dict[str, Any]) -> str:
    return str((attrs.get("Config") or {}).get("WorkingDir") or DEFAULT_WORKDIR)


def _created(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return 0.0

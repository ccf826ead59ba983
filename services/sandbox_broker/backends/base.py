"""The one small interface every sandbox backend implements, and the values it passes around."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, ExecResult, Resources, Template
from services.protocol.status import ErrorCode

# called with ("stdout" | "stderr", bytes) as output arrives (streamed exec)
OutputSink = Callable[[str, bytes], Awaitable[None]]

# labels the broker puts on everything it creates
LABEL_BROKER = "rollout.broker"  # the replica that created it
LABEL_LEASE = "rollout.lease"  # the lease a cold-started sandbox was created for
LABEL_JOB = "rollout.job"
LABEL_POOL = "rollout.pool"  # "1" on warm-pool sandboxes
LABEL_TEMPLATE = "rollout.template"


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What to create."""

    template: Template
    resources: Resources
    network: Literal["none", "egress"] = "none"
    labels: dict[str, str] = field(default_factory=dict)
    clone_of: str | None = None  # a snapshot (ForkingBackend.snapshot) to start from, not an empty sandbox
    isolation: str | None = None  # "namespaces" | "gvisor"; None: the template's, else the backend's own

    @property
    def isolation_level(self) -> str | None:
        return self.isolation or self.template.isolation


@dataclass(frozen=True, slots=True)
class Sandbox:
    """A created sandbox, as the backend can find it again by ``sandbox_id`` (also after a restart)."""

    sandbox_id: str
    labels: dict[str, str]
    workdir: str = "/workspace"
    created_at: float = 0.0
    cloned_s: float = 0.0  # time spent copying ``clone_of`` into it


@runtime_checkable
class ForkingBackend(Protocol):
    """A backend that can copy a sandbox's state to start others from (sandbox fork for groups)."""

    async def snapshot(self, sandbox_id: str) -> str:
        """Copy the sandbox's writable state (while nothing runs in it); return the snapshot's id."""
        ...

    async def drop_snapshot(self, snapshot_id: str) -> None: ...


class Backend(Protocol):
    """A place that runs sandboxes. Every method may raise :class:`PlatformError`."""

    name: str

    async def start(self) -> dict[str, Any]:
        """Probe the host or service; return what it allows (shown on ``/healthz``)."""
        ...

    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def exec(self, sandbox_id: str, request: ExecRequest, sink: OutputSink | None = None) -> ExecResult: ...

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None: ...

    async def read_file(self, sandbox_id: str, path: str) -> bytes: ...

    async def put_archive(self, sandbox_id: str, directory: str, tar: bytes) -> None: ...

    async def get_archive(self, sandbox_id: str, directory: str) -> bytes: ...

    async def alive(self, sandbox_id: str) -> bool: ...

    async def keepalive(self, sandbox_id: str, ttl_s: float) -> None:
        """Tell the backend the sandbox is still wanted for ``ttl_s`` (E2B's timeout)."""
        ...

    async def destroy(self, sandbox_id: str) -> None:
        """Remove the sandbox and everything running in it; idempotent."""
        ...

    async def list_sandboxes(self) -> list[Sandbox]:
        """Every sandbox this backend holds that carries the broker's labels."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class GatewayBinder(Protocol):
    """A backend that forwards a lease's gateway session into its sandbox (local and docker: a Unix socket)."""

    async def bind_gateway(self, sandbox_id: str, session: str, upstream: str, ttl_s: float) -> None: ...


@runtime_checkable
class TaskRouter(Protocol):
    """A backend whose gateway forwarder also relays a task lease's exec and files (a paired agent's sandbox)."""

    def route_task(self, sandbox_id: str, task_lease: str, broker: str) -> None: ...


def no_gateway(backend: str) -> PlatformError:
    """The refusal of a gateway binding (and a ``gateway_port`` exec) on a backend that is no ``GatewayBinder``."""
    why = (f"the {backend} backend does not forward the gateway into its sandboxes (local and docker do): "
           "they run on the provider's hosts, which reach neither this broker's sockets nor a proxy on a "
           "private network; run command agents on the local or docker backend (docs/agents.md)")  # fmt: skip
    return PlatformError(ErrorCode.BAD_REQUEST, why, field="gateway")


def sandbox_gone(sandbox_id: str) -> PlatformError:
    return PlatformError(ErrorCode.SANDBOX_DIED, f"sandbox {sandbox_id} is gone")


def bad_path(path: str, why: str) -> PlatformError:
    return PlatformError(ErrorCode.BAD_REQUEST, f"path {path!r}: {why}", field="path")


class OutputBuffer:
    """Collects one stream up to ``limit`` bytes and remembers whether more came."""

    __slots__ = ("chunks", "limit", "size", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.chunks: list[bytes] = []
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data:
            self.chunks.append(data)
            self.size += len(data)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

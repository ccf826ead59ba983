"""The sandbox broker's HTTP contract, shared by the broker and its clients (the workers).

Routes (all JSON; errors are ``ErrorBody`` with a code from ``ErrorCode``):

- ``POST /leases`` LeaseRequest -> 201 Lease
- ``GET /leases?job=J`` -> list[Lease]
- ``GET /leases/{id}`` -> Lease
- ``POST /leases/{id}/renew`` RenewRequest -> Lease (heartbeat)
- ``POST /leases/renew`` LeaseRenewals -> RenewedLeases (many leases' heartbeat in one call)
- ``DELETE /leases/{id}`` -> 204 (release; idempotent)
- ``POST /leases/{id}/exec`` ExecRequest -> ExecResult (a non-zero exit code is a result, not an error)
- ``POST /leases/{id}/exec/stream`` ExecRequest -> SSE of ExecChunk, the last one with ``result``
- ``PUT /leases/{id}/files?path=P`` raw bytes; ``GET /leases/{id}/files?path=P`` -> raw bytes
- ``PUT /leases/{id}/archive?path=DIR`` a tar archive, extracted under DIR; ``GET`` returns DIR as tar
- ``POST /templates`` Template -> 201; ``GET /templates`` -> list[Template]
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from services.protocol.errors import ErrorDetail
from services.protocol.fields import (
    MAX_DISK_MB,
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MIN_CPUS,
    EnvKey,
    FilePath,
    Isolation,
    Name,
    Text,
)

Label = Annotated[str, StringConstraints(max_length=256, pattern=r"^[^\x00]*$")]


def split_destination(entry: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]:
    """``"10.0.0.0/8"`` -> (network, None); ``"10.0.0.5:5432"`` or ``"[fd00::1]:443"`` -> (network, port)."""
    address, port = entry, None
    if entry.startswith("["):
        address, _, rest = entry[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else -1 if rest else None
    elif entry.count(":") == 1:
        address, _, text = entry.partition(":")
        port = int(text) if text.isdigit() else -1
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{entry!r}: the port must be 1-65535")
    return ipaddress.ip_network(address, strict=False), port


def _destination(entry: str) -> str:
    split_destination(entry)  # raises ValueError on anything else
    return entry


EgressDestination = Annotated[str, Field(max_length=64), AfterValidator(_destination)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # bounds: see services/protocol/fields.py


class Resources(_Model):
    cpus: float = Field(1.0, ge=MIN_CPUS, le=64)
    memory_mb: int = Field(2048, gt=0, le=MAX_MEMORY_MB)
    disk_mb: int = Field(10_240, gt=0, le=MAX_DISK_MB)


class Template(_Model):
    """A sandbox image: written by an operator, read by the broker."""

    name: Name
    # the sandbox's root filesystem. docker: an image in the engine; e2b: a template id; local: a
    # name in the broker's image store (``rollout images import``) or an absolute path to an OCI
    # image layout, a ``docker save``/OCI tar, or a root directory (a path: inside template_roots)
    image: Text | None = None
    host_usr: bool = False  # local + image: also bind the host's /usr read-only over the image's
    rootfs: Text | None = None  # local, no image: a host directory seeding /workspace, inside template_roots
    setup: list[Text] = Field(default_factory=list)  # run once when a sandbox is created, before pooling
    # local: run the setup once per resources, network and isolation, and start the template's other
    # sandboxes from a copy of its result (as an image's layers); False: run it in every sandbox
    share_setup: bool = True
    resources: Resources = Field(default_factory=Resources)
    warm_pool: int = Field(0, ge=0, le=10_000)  # sandboxes kept started and ready
    # destinations an egress sandbox may reach although they are private, link-local or the host's:
    # "10.1.2.0/24", "10.1.2.3:5432" (TCP and UDP to that port), "[fd00::1]:443"
    egress_allow: list[EgressDestination] = Field(default_factory=list, max_length=64)
    isolation: Isolation | None = None  # its sandboxes' (and warm pool's) unless a lease asks otherwise


class SandboxSetup(_Model):
    """A lease's task setup, run by the broker: once per ``key`` when the backend can fork sandboxes
    (local), the other leases of that key starting from a copy of the set-up sandbox's writable state
    (a GRPO group pays its task's setup once); otherwise once per lease. Written by a worker."""

    key: Label  # leases with the same key share one run of the setup (the worker: job and rollout id)
    files: dict[FilePath, str] = Field(default_factory=dict, max_length=10_000)  # path -> content, before the commands
    commands: list[Text] = Field(default_factory=list, max_length=1_000)
    env: dict[EnvKey, Text] = Field(default_factory=dict)
    cwd: Text | None = None  # default: the lease's workdir
    timeout_s: float = Field(300.0, gt=0, le=MAX_TIMEOUT_S)  # per command


class LeaseRequest(_Model):
    """Written by a worker, read by the broker."""

    template: Name = "default"
    resources: Resources = Field(default_factory=Resources)
    ttl_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)  # the lease dies unless renewed within this
    job: Name = "default"  # a job token's own job when left out
    labels: dict[Label, Label] = Field(default_factory=dict, max_length=64)
    network: Literal["none", "egress"] = "none"
    wait_s: float = Field(30.0, ge=0, le=3_600)  # how long to queue for capacity before 429/503
    setup: SandboxSetup | None = None  # run by the broker before the lease is handed out
    isolation: Isolation | None = None  # default: the template's; unlike the template's: never a warm sandbox


class Lease(_Model):
    """Written by the broker."""

    id: str
    template: str
    backend: str  # "local" | "docker" | "e2b"
    job: str
    sandbox_id: str  # the backend's own id (container id, e2b sandbox id, ...)
    expires_at: float  # unix seconds
    warm: bool  # taken from the warm pool
    start_s: float  # time from request to a ready sandbox
    workdir: str = "/workspace"
    labels: dict[str, str] = Field(default_factory=dict)
    setup_s: float = 0.0  # the request's setup in this lease's sandbox: its run, or the copy of a shared one
    setup_shared: bool = False  # started from a copy of another sandbox that ran the same setup key


class RenewRequest(_Model):
    ttl_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)


MAX_RENEWALS = 10_000  # lease ids in one ``POST /leases/renew``


MAX_LEASE_BATCH = 1_024  # leases in one ``POST /leases/batch``


class LeaseBatch(_Model):
    """Several leases asked for in one request (a worker's episodes that start together). Written
    by a worker, read by the broker."""

    leases: list[LeaseRequest] = Field(min_length=1, max_length=MAX_LEASE_BATCH)
    # each lease only from a warm pool: one with no warm sandbox ready now is answered ``warm_miss`` at
    # once (nothing made or reserved), so no lease of the batch waits for another's create
    warm_only: bool = False


class LeaseOutcome(_Model):
    """One lease of a batch: exactly one of the two (``error`` as a single ``POST /leases`` would answer it)."""

    lease: Lease | None = None
    error: ErrorDetail | None = None


class LeaseBatchResult(_Model):
    """Written by the broker: one outcome per lease asked for, in the order asked."""

    results: list[LeaseOutcome]


class LeaseRenewals(_Model):
    """Many leases renewed to the same ttl at once. Written by a worker's heartbeat, read by the broker."""

    ids: list[Label] = Field(max_length=MAX_RENEWALS)
    ttl_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)


class RenewedLeases(_Model):
    """Written by the broker: every id asked for is in exactly one of the two."""

    expires_at: dict[str, float] = Field(default_factory=dict)  # renewed: lease id -> its new expiry (unix s)
    ended: list[str] = Field(default_factory=list)  # no live lease the caller may see: not renewed (404 alone)


class ExecRequest(_Model):
    """Exactly one of ``argv`` and ``shell``."""

    argv: list[Text] | None = Field(None, min_length=1)
    shell: Text | None = None  # run with ``bash -lc`` (or ``sh -c`` where there is no bash)
    timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S)
    env: dict[EnvKey, Text] = Field(default_factory=dict)
    cwd: Text | None = None  # default: the lease's workdir
    stdin: str | None = None
    max_output_bytes: int = Field(1_000_000, ge=0, le=64_000_000)  # per stream; the rest is cut and flagged
    # leave the command's background processes running after it ends (servers); docker only: on local
    # every command has its own pid namespace, so they always end with it
    keep_background: bool = False
    # local only: listen on 127.0.0.1:PORT in the command's network namespace and relay each connection
    # to the lease's gateway socket (``GATEWAY_SOCKET``, bound by ``POST /leases/{id}/gateway`` first)
    gateway_port: int | None = Field(None, ge=1024, le=65_535)


GATEWAY_SOCKET = "/run/rollout/gateway.sock"  # inside a local sandbox: its lease's gateway forwarder


class GatewayBinding(_Model):
    """``POST /leases/{id}/gateway`` (service token): forward ``/e/{session}/...`` and nothing else
    from the sandbox's ``GATEWAY_SOCKET`` to ``upstream`` (the proxy), for ``ttl_s`` at most.
    Written by the worker when it opens the episode's gateway session, read by the broker."""

    session: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{8,64}$")]  # the gateway session id
    upstream: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/?#]+/?$", max_length=512)]  # the proxy
    ttl_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)
    # a paired agent's sandbox (local only): also relay ``/leases/{task_lease}/...`` to ``broker``, where the
    # agent's lease token (scoped to that one lease) is checked; the task lease must be of the same job
    task_lease: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")] | None = None
    broker: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/?#]+/?$", max_length=512)] | None = None

    @model_validator(mode="after")
    def _task_lease_and_broker_together(self) -> GatewayBinding:
        if (self.task_lease is None) != (self.broker is None):
            raise ValueError("task_lease and broker go together")
        return self


class ExecResult(_Model):
    exit_code: int  # 124 when the command was killed by its timeout (``timed_out`` is then True)
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration_s: float  # inside the sandbox
    broker_s: float = 0.0  # total time in the broker, duration_s included
    # the command's CPU seconds (user + system, with the children it waited for), where its backend
    # measures them (local sandboxes' exec agents); None elsewhere
    cpu_s: float | None = None


class ExecChunk(_Model):
    """One SSE event of a streamed exec."""

    stream: Literal["stdout", "stderr", "result"]
    data: str = ""
    result: ExecResult | None = None

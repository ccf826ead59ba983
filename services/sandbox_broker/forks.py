"""A lease's task setup, run by the broker, and shared by the leases of one group (sandbox fork).

The first lease of a setup key gets a sandbox, runs the setup in it (files, then commands) and, on a
backend that can fork (``ForkingBackend``: local), snapshots the sandbox's writable state. Leases
of the same key that come meanwhile wait for that; every later one starts from a copy of the
snapshot instead of running the setup again, and is marked ``setup_shared``. A key is scoped to its
job and to the exact setup, template, resources and network, so a lease can only ever share a setup
it would have run itself. Where the backend cannot fork, or the first setup failed, each lease
runs the setup itself. Snapshots are dropped once unused for ``ttl_s``.

A template's setup is shared the same way (``TemplateSetups``), by every sandbox of that template
with the same resources, network and isolation, cold leases and warm-pool refills alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, LeaseRequest, SandboxSetup
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import Backend, ForkingBackend, Sandbox, SandboxSpec

log = logging.getLogger(__name__)

Create = Callable[[str | None], Awaitable[Sandbox]]  # a sandbox for the lease, from a snapshot or fresh
CreateSpec = Callable[[SandboxSpec], Awaitable[Sandbox]]  # the backend's create


@dataclass(frozen=True, slots=True)
class SetUp:
    sandbox: Sandbox
    setup_s: float  # the setup's run here, or the copy of a shared one
    shared: bool


@dataclass
class _Entry:
    ready: asyncio.Future[str | None]  # the snapshot id, or None when there is none to share
    used_at: float = field(default_factory=time.monotonic)


class SharedSnapshots:
    """Snapshots shared by key: the first caller of a key makes its sandbox and snapshots it, the
    callers that come meanwhile wait for that, later ones get the snapshot at once. A snapshot is
    dropped once unused for ``ttl_s``; a first that failed leaves no entry (the next one tries again)."""

    def __init__(self, backend: Backend, ttl_s: float) -> None:
        self.backend = backend
        self.ttl_s = ttl_s
        self.entries: dict[str, _Entry] = {}

    async def first_or_snapshot(self, key: str, first: Callable[[], Awaitable[Sandbox]]) -> tuple[bool, str | None]:
        """``(True, None)`` for the key's first caller, which ran ``first`` (its sandbox is
        snapshotted), else ``(False, the snapshot id)``, None when the first made none."""
        await self._expire()
        entry = self.entries.get(key)
        if entry is not None:
            shared = await asyncio.shield(entry.ready)
            entry.used_at = time.monotonic()
            return False, shared
        entry = self.entries[key] = _Entry(asyncio.get_running_loop().create_future())
        snapshot_id: str | None = None
        try:
            sandbox = await first()
            assert isinstance(self.backend, ForkingBackend)
            try:
                snapshot_id = await self.backend.snapshot(sandbox.sandbox_id)
            except OSError as exc:  # the sandbox is set up all the same; the others run their own
                log.warning("no snapshot of %s to share (%s): each sandbox of its key sets itself up",
                            sandbox.sandbox_id, exc)  # fmt: skip
                self.entries.pop(key, None)
            return True, None
        except BaseException:
            self.entries.pop(key, None)  # the next caller of the key tries again
            raise
        finally:
            entry.ready.set_result(snapshot_id)

    async def _expire(self) -> None:
        """Drop the snapshots unused for ``ttl_s``. Every expired entry leaves the table before the
        first await: callers expiring at once never drop one twice, nor one made since for the key."""
        now = time.monotonic()
        expired = [k for k, e in self.entries.items() if e.ready.done() and now - e.used_at > self.ttl_s]
        for entry in [self.entries.pop(key) for key in expired]:
            await self._drop(entry)

    async def close(self) -> None:
        for entry in self.entries.values():
            await self._drop(entry)
        self.entries.clear()

    async def _drop(self, entry: _Entry) -> None:
        snapshot_id = entry.ready.result() if entry.ready.done() and not entry.ready.cancelled() else None
        if snapshot_id is not None and isinstance(self.backend, ForkingBackend):
            with contextlib.suppress(OSError):
                await self.backend.drop_snapshot(snapshot_id)


class SharedSetups(SharedSnapshots):
    async def sandbox_for(self, request: LeaseRequest, create: Create) -> SetUp:
        """A set-up sandbox for ``request`` (which has a setup): the first of its key, or a fork."""
        assert request.setup is not None
        setup = request.setup
        if not isinstance(self.backend, ForkingBackend):
            return await self._own(setup, await create(None))

        done: list[SetUp] = []

        async def first() -> Sandbox:
            done.append(await self._own(setup, await create(None)))
            return done[0].sandbox

        ran, snapshot_id = await self.first_or_snapshot(_key(request), first)
        if ran:
            return done[0]
        if snapshot_id is None:
            return await self._own(setup, await create(None))
        sandbox = await create(snapshot_id)
        return SetUp(sandbox, sandbox.cloned_s, True)

    async def _own(self, setup: SandboxSetup, sandbox: Sandbox) -> SetUp:
        """Run the setup in ``sandbox`` (destroyed if the setup fails)."""
        started = time.monotonic()
        try:
            await run_setup(self.backend, sandbox, setup)
        except BaseException:
            await self.backend.destroy(sandbox.sandbox_id)
            raise
        return SetUp(sandbox, time.monotonic() - started, False)


class TemplateSetups(SharedSnapshots):
    """A template's setup, run once per key: the first sandbox of a template (with given resources,
    network and isolation) runs it and is snapshotted, the others start from a copy of that
    (``SandboxSpec.clone_of``) instead of running it again, as a container image's layers are built
    once. Only on a backend that can fork, for a template that shares its setup (``share_setup``)."""

    async def create(self, spec: SandboxSpec, create: CreateSpec) -> tuple[Sandbox, str | None]:
        """The sandbox, and how its template's setup came: ``ran`` (here, shared from now on),
        ``shared`` (a copy of the first's), ``own`` (ran here, not shared); None: no setup to run (the
        template has none, or the sandbox is a clone, whose copy holds its result)."""
        template = spec.template
        if not template.setup or spec.clone_of is not None:
            return await create(spec), None
        if not template.share_setup or not isinstance(self.backend, ForkingBackend):
            return await create(spec), "own"

        done: list[Sandbox] = []

        async def first() -> Sandbox:
            done.append(await create(spec))
            return done[0]

        ran, snapshot_id = await self.first_or_snapshot(_template_key(spec), first)
        if ran:
            return done[0], "ran"
        if snapshot_id is None:
            return await create(spec), "own"
        return await create(dataclasses.replace(spec, clone_of=snapshot_id)), "shared"


async def run_setup(backend: Backend, sandbox: Sandbox, setup: SandboxSetup) -> None:
    """The setup's files, then its commands (each must exit 0) in ``sandbox``."""
    cwd = setup.cwd or sandbox.workdir
    for path, content in setup.files.items():
        await backend.write_file(sandbox.sandbox_id, path, content.encode())
    for command in setup.commands:
        request = ExecRequest(shell=command, timeout_s=setup.timeout_s, env=setup.env, cwd=cwd)
        result = await backend.exec(sandbox.sandbox_id, request)
        if result.exit_code != 0:
            output = (result.stdout + result.stderr)[-300:]
            raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED,
                                f"setup command {command[:200]!r} exited {result.exit_code}: {output}")  # fmt: skip


def _template_key(spec: SandboxSpec) -> str:
    """Everything a template's setup ran with: the template itself, resources, network, isolation."""
    made_by = spec.template.model_dump(mode="json", exclude={"warm_pool", "resources"})  # not what the setup sees
    scope = {"template": made_by, "resources": spec.resources.model_dump(mode="json"),
             "network": spec.network, "isolation": spec.isolation_level}  # fmt: skip
    return hashlib.sha256(json.dumps(scope, sort_keys=True).encode()).hexdigest()


def _key(request: LeaseRequest) -> str:
    """The setup key, scoped to the job and to everything that makes the set-up sandbox what it is."""
    scope = request.model_dump_json(include={"template", "resources", "job", "network", "setup"})
    return hashlib.sha256(scope.encode()).hexdigest()

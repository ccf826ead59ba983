"""A lease's task setup, run by the broker, and shared by the leases of one group (sandbox fork).

The first lease of a setup key gets a sandbox, runs the setup in it (files, then commands) and, on a
backend that can fork (``ForkingBackend``: local), snapshots the sandbox's writable state. Leases
of the same key that come meanwhile wait for that; every later one starts from a copy of the
snapshot instead of running the setup again, and is marked ``setup_shared``. A key is scoped to its
job and to the exact setup, template, resources and network, so a lease can only ever share a setup
it would have run itself. Where the backend cannot fork, or the first setup failed, each lease
runs the setup itself. Snapshots are dropped once unused for ``ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, LeaseRequest, SandboxSetup
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import Backend, ForkingBackend, Sandbox

log = logging.getLogger(__name__)

Create = Callable[[str | None], Awaitable[Sandbox]]  # a sandbox for the lease, from a snapshot or fresh


@dataclass(frozen=True, slots=True)
class SetUp:
    sandbox: Sandbox
    setup_s: float  # the setup's run here, or the copy of a shared one
    shared: bool


@dataclass
class _Entry:
    ready: asyncio.Future[str | None]  # the snapshot id, or None when there is none to share
    used_at: float = field(default_factory=time.monotonic)


class SharedSetups:
    def __init__(self, backend: Backend, ttl_s: float) -> None:
        self.backend = backend
        self.ttl_s = ttl_s
        self.entries: dict[str, _Entry] = {}

    async def sandbox_for(self, request: LeaseRequest, create: Create) -> SetUp:
        """A set-up sandbox for ``request`` (which has a setup): the first of its key, or a fork."""
        assert request.setup is not None
        await self._expire()
        if not isinstance(self.backend, ForkingBackend):
            return await self._own(request.setup, await create(None))
        key = _key(request)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = _Entry(asyncio.get_running_loop().create_future())
            return await self._first(key, entry, request.setup, create)
        snapshot_id = await asyncio.shield(entry.ready)
        entry.used_at = time.monotonic()
        if snapshot_id is None:
            return await self._own(request.setup, await create(None))
        sandbox = await create(snapshot_id)
        return SetUp(sandbox, sandbox.cloned_s, True)

    async def _first(self, key: str, entry: _Entry, setup: SandboxSetup, create: Create) -> SetUp:
        snapshot_id: str | None = None
        try:
            done = await self._own(setup, await create(None))
            assert isinstance(self.backend, ForkingBackend)
            snapshot_id = await self.backend.snapshot(done.sandbox.sandbox_id)
            return done
        except Exception:
            self.entries.pop(key, None)  # the next lease of the key tries again
            raise
        finally:
            entry.ready.set_result(snapshot_id)

    async def _own(self, setup: SandboxSetup, sandbox: Sandbox) -> SetUp:
        """Run the setup in ``sandbox`` (destroyed if the setup fails)."""
        started = time.monotonic()
        try:
            await run_setup(self.backend, sandbox, setup)
        except BaseException:
            await self.backend.destroy(sandbox.sandbox_id)
            raise
        return SetUp(sandbox, time.monotonic() - started, False)

    async def _expire(self) -> None:
        """Drop the snapshots unused for ``ttl_s``. Every expired entry leaves the table before the
        first await: leases expiring at once never drop one twice, nor one made since for the key."""
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


def _key(request: LeaseRequest) -> str:
    """The setup key, scoped to the job and to everything that makes the set-up sandbox what it is."""
    scope = request.model_dump_json(include={"template", "resources", "job", "network", "setup"})
    return hashlib.sha256(scope.encode()).hexdigest()

"""The fake E2B's state: sandboxes (each a real local bubblewrap sandbox), their deadlines, the
plan's limits (creates per second, concurrent sandboxes) and injectable faults."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.protocol.sandboxes import Resources, Template
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.settings import BrokerSettings

log = logging.getLogger(__name__)

ENVD_VERSION = "0.5.7"  # octet-stream uploads, stdin flag, default user


@dataclass
class FakeSandbox:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    local_id: str
    token: str
    started_at: float
    end_at: float
    processes: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    next_pid: int = 100

    def listed(self) -> dict[str, Any]:
        return {"templateID": self.template, "sandboxID": self.sandbox_id, "clientID": "fake",
                "startedAt": _iso(self.started_at), "endAt": _iso(self.end_at), "cpuCount": 2, "memoryMB": 512,
                "diskSizeMB": 1024, "state": "running", "envdVersion": ENVD_VERSION,
                "metadata": self.metadata}  # fmt: skip

    def created(self) -> dict[str, Any]:
        return {"templateID": self.template, "sandboxID": self.sandbox_id, "clientID": "fake",
                "envdVersion": ENVD_VERSION, "envdAccessToken": self.token}  # fmt: skip


@dataclass
class Faults:
    """Counters of injected failures, consumed one request at a time."""

    create_429: int = 0  # next creates answer 429 (rate limited)
    envd_502: int = 0  # next envd requests answer 502 from the "proxy"


class FakeE2BState:
    def __init__(self, state_dir: str, create_rate: float, max_concurrent: int) -> None:
        self.local = LocalBackend(BrokerSettings(state_dir=state_dir))
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.create_rate = create_rate
        self.max_concurrent = max_concurrent
        self.faults = Faults()
        self._tokens = float(max(create_rate, 1))
        self._stamp = time.monotonic()
        self._expiry: asyncio.Task[None] | None = None
        self.creates = 0
        self.rate_limited = 0

    async def start(self) -> None:
        await self.local.start()
        self._expiry = asyncio.get_running_loop().create_task(self._expire())

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        for sandbox_id in list(self.sandboxes):
            await self.kill(sandbox_id)

    def admit_create(self) -> str | None:
        """None when a create may go ahead, else the 429 message E2B answers with."""
        if self.faults.create_429 > 0:
            self.faults.create_429 -= 1
            return "Rate limit exceeded"
        if len(self.sandboxes) >= self.max_concurrent:
            return f"maximum number of concurrent E2B sandboxes ({self.max_concurrent})"
        if self.create_rate > 0:
            now = time.monotonic()
            self._tokens = min(max(self.create_rate, 1), self._tokens + (now - self._stamp) * self.create_rate)
            self._stamp = now
            if self._tokens < 1:
                return "Rate limit exceeded: too many sandbox creates per second"
            self._tokens -= 1
        return None

    async def create(self, template: str, timeout_s: float, metadata: dict[str, str], egress: bool) -> FakeSandbox:
        spec = SandboxSpec(Template(name="e2b"), Resources(), "egress" if egress else "none", {})
        local = await self.local.create(spec)
        now = time.time()
        sandbox = FakeSandbox("sbx" + secrets.token_hex(8), template, metadata, local.sandbox_id,
                              secrets.token_hex(16), now, now + timeout_s)  # fmt: skip
        self.sandboxes[sandbox.sandbox_id] = sandbox
        self.creates += 1
        return sandbox

    async def kill(self, sandbox_id: str) -> bool:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return False
        for task in sandbox.processes.values():
            task.cancel()
        await self.local.destroy(sandbox.local_id)
        return True

    def set_timeout(self, sandbox_id: str, timeout_s: float) -> bool:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            return False
        sandbox.end_at = time.time() + timeout_s
        return True

    def matching(self, metadata: dict[str, str]) -> list[FakeSandbox]:
        return [s for s in self.sandboxes.values() if all(s.metadata.get(k) == v for k, v in metadata.items())]

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            now = time.time()
            for sandbox in [s for s in self.sandboxes.values() if s.end_at < now]:
                log.info("fake e2b: sandbox %s reached its timeout", sandbox.sandbox_id)
                await self.kill(sandbox.sandbox_id)


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z")

"""The ``e2b`` backend: sandboxes through the ``e2b`` SDK's AsyncSandbox.

Created with metadata (lease, job, broker) so that orphans are found by metadata after a restart;
``set_timeout`` is the heartbeat, so a dead broker's sandboxes die by themselves; every command
runs with an explicit timeout (the SDK's default is 60 s) and is killed at the deadline;
``CommandExitException`` becomes a normal result; 429s are retried with backoff; a "timeout"
that comes before the command's deadline is E2B's proxy answering 502 and is an infrastructure
failure, not a command timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import random
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from e2b import AsyncSandbox, CommandExitException
from e2b.sandbox.sandbox_api import SandboxQuery

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, ExecResult
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import OutputBuffer, OutputSink, Sandbox, SandboxSpec
from services.sandbox_broker.backends.e2b_errors import classify, is_rate_limit
from services.sandbox_broker.settings import BrokerSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

MANAGED = "rollout.managed"  # metadata on every sandbox the broker creates: how orphans are listed
STREAM_SLACK_S = 5  # the SDK's own stream timeout, past the broker's deadline


class E2BBackend:
    name = "e2b"

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.workdir = settings.e2b_workdir
        self.max_output_bytes = settings.max_output_bytes
        given = {
            "api_key": settings.e2b_api_key,
            "api_url": settings.e2b_api_url,
            "sandbox_url": settings.e2b_sandbox_url,
        }
        self.opts: dict[str, Any] = {k: v for k, v in given.items() if v}
        self._sandboxes: dict[str, AsyncSandbox] = {}
        self._live = 0

    async def start(self) -> dict[str, Any]:
        reachable = True
        try:
            await self.list_sandboxes()
        except PlatformError as exc:
            reachable = False
            log.warning("E2B API not reachable at start: %s", exc.message)
        s = self.settings
        return {"isolated": True, "service": s.e2b_api_url or "e2b cloud", "reachable": reachable,
                "default_template": s.e2b_template, "max_sandboxes": s.e2b_max_sandboxes}  # fmt: skip

    async def close(self) -> None:
        self._sandboxes.clear()

    async def _retrying(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """``call`` with 429s retried (exponential backoff, jitter); other errors classified."""
        for attempt in range(self.settings.e2b_retries + 1):
            try:
                return await call()
            except Exception as exc:
                if not is_rate_limit(exc) or attempt == self.settings.e2b_retries:
                    raise classify(exc, what) from exc
                delay = min(5.0, 0.2 * 2**attempt) * (0.5 + random.random())
                log.info("E2B rate limit on %s; retrying in %.2fs", what, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    # -- sandboxes -----------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if self._live >= self.settings.e2b_max_sandboxes:
            raise PlatformError(ErrorCode.CAPACITY_EXHAUSTED, f"E2B concurrency cap {self.settings.e2b_max_sandboxes}",
                                retry_after_s=1.0)  # fmt: skip
        metadata = {**spec.labels, MANAGED: "true"}
        template = spec.template.image or self.settings.e2b_template
        self._live += 1
        try:
            sandbox = await self._retrying(lambda: AsyncSandbox.create(
                template=template, timeout=self.settings.e2b_sandbox_timeout_s, metadata=metadata,
                allow_internet_access=spec.network == "egress", **self.opts), "create")  # fmt: skip
        except BaseException:
            self._live -= 1
            raise
        self._sandboxes[sandbox.sandbox_id] = sandbox
        try:
            for command in spec.template.setup:
                result = await self.exec(
                    sandbox.sandbox_id, ExecRequest(shell=command, timeout_s=self.settings.setup_timeout_s)
                )
                if result.exit_code != 0:
                    raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, f"template setup {command!r} exited "
                                        f"{result.exit_code}: {result.stderr[-500:]}")  # fmt: skip
        except BaseException:
            await self.destroy(sandbox.sandbox_id)
            raise
        return Sandbox(sandbox.sandbox_id, spec.labels, self.workdir, time.time())

    async def _sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """The SDK object of a sandbox, reconnecting to it (e.g. after a broker restart)."""
        cached = self._sandboxes.get(sandbox_id)
        if cached is not None:
            return cached
        sandbox = await self._retrying(lambda: AsyncSandbox.connect(sandbox_id, **self.opts), "connect")
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def alive(self, sandbox_id: str) -> bool:
        try:
            return bool(await (await self._sandbox(sandbox_id)).is_running())
        except Exception:
            return False

    async def keepalive(self, sandbox_id: str, ttl_s: float) -> None:
        await self._retrying(lambda: AsyncSandbox.set_timeout(sandbox_id, int(ttl_s) + 1, **self.opts), "set_timeout")

    async def destroy(self, sandbox_id: str) -> None:
        self._sandboxes.pop(sandbox_id, None)
        killed = await self._retrying(lambda: AsyncSandbox.kill(sandbox_id, **self.opts), "kill")
        if killed:
            self._live = max(0, self._live - 1)

    async def list_sandboxes(self) -> list[Sandbox]:
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={MANAGED: "true"}), **self.opts)
        found: list[Sandbox] = []
        while paginator.has_next:
            page = await self._retrying(paginator.next_items, "list")
            found += [
                Sandbox(i.sandbox_id, dict(i.metadata or {}), self.workdir, i.started_at.timestamp()) for i in page
            ]
        self._live = len(found)
        return found

    # -- commands ------------------------------------------------------------------------------

    async def exec(self, sandbox_id: str, request: ExecRequest, sink: OutputSink | None = None) -> ExecResult:
        sandbox = await self._sandbox(sandbox_id)
        command = request.shell if request.shell is not None else shlex.join(request.argv or [])
        env = dict(request.env)
        if request.stdin is not None:
            env["ROLLOUT_STDIN"] = request.stdin
            command = f'printf %s "$ROLLOUT_STDIN" | ( {command} )'
        limit = min(request.max_output_bytes, self.max_output_bytes)
        out, err = OutputBuffer(limit), OutputBuffer(limit)

        def collect(buffer: OutputBuffer, name: str) -> Callable[[str], Awaitable[None]]:
            async def on_output(text: str) -> None:  # the SDK awaits it
                data = text.encode()
                buffer.add(data)
                if sink is not None:
                    await sink(name, data)

            return on_output

        started = time.monotonic()
        handle = await self._retrying(lambda: sandbox.commands.run(
            command, background=True, envs=env, cwd=request.cwd or self.workdir,
            timeout=request.timeout_s + STREAM_SLACK_S, on_stdout=collect(out, "stdout"),
            on_stderr=collect(err, "stderr")), "exec")  # fmt: skip
        timed_out, code = False, 0
        try:
            code = (await asyncio.wait_for(handle.wait(), request.timeout_s)).exit_code
        except CommandExitException as exc:  # a non-zero exit is a result
            code = exc.exit_code
        except TimeoutError:
            timed_out, code = True, 124
            with contextlib.suppress(Exception):
                await handle.kill()
        except Exception as exc:
            if time.monotonic() - started < request.timeout_s:
                raise classify(exc, "exec") from exc
            timed_out, code = True, 124
        finally:
            with contextlib.suppress(Exception):
                await handle.disconnect()
        duration = time.monotonic() - started
        return ExecResult(exit_code=code, stdout=out.text(), stderr=err.text(), stdout_truncated=out.truncated,
                          stderr_truncated=err.truncated, timed_out=timed_out, duration_s=duration)  # fmt: skip

    # -- files ---------------------------------------------------------------------------------

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        sandbox = await self._sandbox(sandbox_id)
        await self._retrying(lambda: sandbox.files.write(self._path(path), data, use_octet_stream=True), "write")

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        sandbox = await self._sandbox(sandbox_id)
        data = await self._retrying(lambda: sandbox.files.read(self._path(path), format="bytes"), "read")
        return bytes(data)

    async def put_archive(self, sandbox_id: str, directory: str, tar: bytes) -> None:
        staged = f"/tmp/.rollout-{secrets.token_hex(6)}.tar"
        await self.write_file(sandbox_id, staged, tar)
        target = shlex.quote(self._path(directory))
        script = f"mkdir -p {target} && tar -xf {staged} -C {target} --no-same-owner; rc=$?; rm -f {staged}; exit $rc"
        result = await self.exec(sandbox_id, ExecRequest(shell=script, timeout_s=300))
        if result.exit_code != 0:
            raise PlatformError(ErrorCode.BAD_REQUEST, f"bad tar archive: {result.stderr[-300:]}", field="body")

    async def get_archive(self, sandbox_id: str, directory: str) -> bytes:
        staged = f"/tmp/.rollout-{secrets.token_hex(6)}.tar"
        script = f"tar -cf {staged} -C {shlex.quote(self._path(directory))} ."
        result = await self.exec(sandbox_id, ExecRequest(shell=script, timeout_s=300))
        if result.exit_code != 0:
            raise PlatformError(ErrorCode.NOT_FOUND, f"no directory {directory!r} in the sandbox")
        try:
            return await self.read_file(sandbox_id, staged)
        finally:
            await self.exec(sandbox_id, ExecRequest(argv=["rm", "-f", staged], timeout_s=30))

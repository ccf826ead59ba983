"""A ``command`` agent inside the task sandbox (``where: "sandbox"``): its argv runs through the
broker's streaming exec, as the sandbox's unprivileged user, in its own process group, with the
episode's wall clock as timeout; the tail of its output is kept as it streams.

The program sees the sandbox's own filesystem (its tools act on the task's files), the gateway
(``OPENAI_*``, ``ANTHROPIC_*`` at ``http://127.0.0.1:PORT``: the broker's relay in the sandbox's own
network namespace, to a per-lease socket that passes this session only), ``ROLLOUT_TASK``, the
task's ``sandbox.env`` and the spec's ``env``; no broker credentials (it needs none: it is where the
task is).
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import orjson
from pydantic import ValidationError

from services.protocol import ErrorCode, InfraStage
from services.protocol.agents import AGENTS_DIR, BUNDLE_MANIFEST, AgentBundle, CommandAgent
from services.protocol.sandboxes import ExecChunk, ExecRequest, ExecResult
from services.protocol.trajectory import AgentRun
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError


async def run_in_sandbox(
    broker: BrokerClient, lease_id: str, spec: CommandAgent, env: dict[str, str], *, cwd: str, timeout_s: float,
    gateway_port: int | None, record: AgentRun,
) -> bool:  # fmt: skip
    """Run the program to its end (behind the broker's relay of the gateway on ``gateway_port``);
    whether its timeout (the episode's wall clock) ended it. A cancellation closes the stream, and
    the broker then kills the program with its sandbox's agent."""
    argv = spec.argv
    if spec.bundle is not None:  # its commands first on PATH, whatever PATH the sandbox has
        await read_bundle(broker, lease_id, spec.bundle, record)
        argv = ["/bin/sh", "-c", f'PATH={AGENTS_DIR}/{spec.bundle}/bin:$PATH; export PATH; exec "$@"', "sh", *argv]
    request = ExecRequest(argv=argv, env=env, cwd=cwd, timeout_s=timeout_s, gateway_port=gateway_port,
                          max_output_bytes=spec.output_max_bytes)  # fmt: skip
    tail = bytearray()

    def keep(data: str) -> None:
        tail.extend(data.encode())
        del tail[: max(0, len(tail) - spec.output_max_bytes)]

    try:
        result = await stream_exec(broker, lease_id, request, keep)
    finally:
        record.last_output = tail.decode(errors="replace")
    record.exit_code = result.exit_code
    return result.timed_out


async def read_bundle(broker: BrokerClient, lease_id: str, name: str, record: AgentRun) -> None:
    """The bundle's manifest as the sandbox sees it: its name, version and digest go on the record."""
    path = f"{AGENTS_DIR}/{name}/{BUNDLE_MANIFEST}"
    result = await broker.exec(lease_id, ExecRequest(argv=["cat", path], timeout_s=30, max_output_bytes=65_536))
    try:
        bundle = AgentBundle.model_validate_json(result.stdout) if result.exit_code == 0 else None
    except ValidationError:
        bundle = None
    if bundle is None:
        raise InfraError(InfraStage.SANDBOX_EXEC, ErrorCode.BAD_REQUEST, f"no agent bundle {name!r} in the sandbox "
                         f"({path}): install it on the broker's host (rollout agents install {name} --dir DIR, "
                         "ROLLOUT_BROKER_AGENTS_DIR=DIR)", retryable=False)  # fmt: skip
    record.bundle, record.bundle_version, record.bundle_digest = bundle.name, bundle.version, bundle.digest


async def stream_exec(
    broker: BrokerClient, lease_id: str, request: ExecRequest, keep: Callable[[str], None]
) -> ExecResult:
    """``POST /leases/{id}/exec/stream``: every output chunk to ``keep``, then the result."""
    url = f"{broker.url}/leases/{lease_id}/exec/stream"
    headers = {"Authorization": f"Bearer {broker.token}"} if broker.token else {}
    timeout = aiohttp.ClientTimeout(total=request.timeout_s + broker.overhead_s, sock_connect=broker.overhead_s)
    body = request.model_dump(mode="json", exclude_none=True)
    try:
        async with broker.session.post(url, json=body, headers=headers, timeout=timeout) as response:
            if response.status != 200:
                raise _refused(response.status, await response.read())
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                chunk = ExecChunk.model_validate_json(line[6:])
                if chunk.stream != "result":
                    keep(chunk.data)
                elif chunk.result is not None:
                    return chunk.result
                else:
                    raise _refused(500, chunk.data.encode())
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise InfraError(InfraStage.SANDBOX_EXEC, ErrorCode.TRANSPORT_ERROR,
                         f"the agent's exec stream broke: {exc!r}") from exc  # fmt: skip
    raise InfraError(InfraStage.SANDBOX_EXEC, ErrorCode.TRANSPORT_ERROR, "the agent's exec stream ended early")


def _refused(status: int, raw: bytes) -> InfraError:
    try:
        code = ErrorCode(orjson.loads(raw)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        code = ErrorCode.INTERNAL_ERROR
    retryable = code.infra or code is ErrorCode.LEASE_NOT_FOUND  # a lease that ended: again with a new one
    return InfraError(InfraStage.SANDBOX_EXEC, code, f"the broker refused the agent's exec ({status}): {raw[:300]!r}",
                      retryable=retryable)  # fmt: skip

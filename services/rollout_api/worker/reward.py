"""Scoring an episode: the task's reward command, run in the episode's sandbox."""

from __future__ import annotations

from services.protocol import ErrorCode, InfraStage, RewardDetails, RewardSpec
from services.protocol.sandboxes import ExecRequest
from services.rollout_api.worker.clients import BrokerClient, InfraError
from services.rollout_api.worker.conversation import truncate_middle

OUTPUT_KEPT_BYTES = 8_000


def parse_reward(stdout: str) -> float | None:
    """The float on the last non-empty line of ``stdout``, if there is one."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        return float(lines[-1])
    except ValueError:
        return None


async def score(broker: BrokerClient, lease_id: str, spec: RewardSpec) -> tuple[float, RewardDetails]:
    """Exit 0 -> 1.0, else 0.0; or the printed float when ``parse_float``. A test run that times
    out scores 0.0 (the policy's code hung); a broken harness raises :class:`InfraError`."""
    try:
        for path, content in spec.files.items():  # fresh copies: the agent's edits to them do not count
            await broker.write_file(lease_id, path, content)
    except InfraError as exc:
        message = f"writing reward files: {exc.message}"
        raise InfraError(InfraStage.REWARD, exc.code, message, retryable=exc.retryable) from exc
    request = ExecRequest(shell=spec.command, timeout_s=spec.timeout_s, max_output_bytes=1_000_000)
    result = await broker.exec(lease_id, request, stage=InfraStage.REWARD)
    output = truncate_middle(result.stdout + result.stderr, OUTPUT_KEPT_BYTES)
    details = RewardDetails(exit_code=result.exit_code, output=output, duration_s=result.duration_s)
    if result.timed_out or not spec.parse_float:
        return (1.0 if result.exit_code == 0 and not result.timed_out else 0.0), details
    value = parse_reward(result.stdout)
    if result.exit_code != 0 or value is None:
        raise InfraError(
            InfraStage.REWARD, ErrorCode.INTERNAL_ERROR,
            f"reward script exited {result.exit_code} without a float on its last line: {output[-300:]!r}",
        )  # fmt: skip
    details.parsed = True
    return value, details

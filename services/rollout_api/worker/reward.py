"""Scoring an episode: the task's reward command, run in the episode's sandbox.

The reward step cannot fail silently: when the command cannot run for a reason of the environment
(interpreter or test runner missing, exit 126/127, the runner's own internal error, a failed or
timed-out reward setup step) the attempt is an :class:`InfraError` at stage ``reward``, retried
like any infra failure; only the policy's own failures score 0.
"""

from __future__ import annotations

import re
import shlex
import uuid
from pathlib import Path

from services.protocol import ErrorCode, InfraStage, RewardDetails, RewardSpec
from services.protocol.sandboxes import ExecRequest, ExecResult
from services.rollout_api.worker import outcomes, swebench_parsers
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.conversation import truncate_middle
from services.rollout_api.worker.restore import Snapshot, restore

OUTPUT_KEPT_BYTES = 8_000
REWARD_OUTPUT_BYTES = 8_000_000  # the per-test summary is at the end of a long log
CANNOT_RUN_EXIT_CODES = {126: "not executable", 127: "command not found"}
# the runner itself is missing or crashed (not a test failing, not the policy's code failing to import)
RUNNER_BROKEN = re.compile(r"No module named '?(pytest|_pytest|unittest)'?$|^INTERNALERROR>", re.MULTILINE)

GRADER_DIR = "/tmp/rollout-grader"  # the grader's pytest plugin and its reports, written at scoring time
PLUGIN = "rollout_pytest_report"
PLUGIN_SOURCE = (Path(__file__).parent / "pytest_report.py").read_bytes()


def parse_reward(stdout: str) -> float | None:
    """The float on the last non-empty line of ``stdout``, if there is one."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        return float(lines[-1])
    except ValueError:
        return None


async def score(
    broker: BrokerClient, lease_id: str, spec: RewardSpec, *, cwd: str | None = None,
    env: dict[str, str] | None = None, saved: Snapshot | None = None,
) -> tuple[float, RewardDetails]:  # fmt: skip
    """Exit 0 -> 1.0, else 0.0; the printed float when ``parse_float``; with ``tests``, 1.0 only if
    every named test has the right outcome. A test run that times out scores 0.0 (the policy's code
    hung); an environment that cannot run the reward raises :class:`InfraError`."""
    env = env or {}
    await _prepare(broker, lease_id, spec, cwd, env, saved or {})
    report = await _install_plugin(broker, lease_id) if spec.tests and spec.tests.log_parser in REPORTED else None
    command = with_plugin(spec.command, report) if report else spec.command
    request = ExecRequest(shell=command, timeout_s=spec.timeout_s, max_output_bytes=REWARD_OUTPUT_BYTES,
                          env=env, cwd=cwd)  # fmt: skip
    result = await broker.exec(lease_id, request, stage=InfraStage.REWARD)
    log = result.stdout + result.stderr
    output = truncate_middle(log, OUTPUT_KEPT_BYTES)
    details = RewardDetails(exit_code=result.exit_code, output=output, duration_s=result.duration_s)
    if not result.timed_out:
        _check_runnable(result, log, output)
    if spec.tests is not None:
        reported = await _read(broker, lease_id, report) if report else None  # pytest ran with the plugin
        if reported is not None:
            statuses = outcomes.parse_report(reported)
        elif spec.tests.swebench_parser is not None:
            statuses = _swebench(log, spec.tests.swebench_parser)
        else:
            statuses = outcomes.parse(log, spec.tests.log_parser)
        resolved, details.tests = outcomes.grade(statuses, spec.tests)
        details.parsed = True
        return (1.0 if resolved else 0.0), details
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


async def _prepare(
    broker: BrokerClient, lease_id: str, spec: RewardSpec, cwd: str | None, env: dict[str, str], saved: Snapshot
) -> None:
    """Put saved files back, write the task's fresh files, run the reward's setup steps."""
    await restore(broker, lease_id, saved, env=env, timeout_s=spec.timeout_s)
    try:
        for path, file_content in spec.files.items():  # fresh copies: the agent's edits to them do not count
            await broker.write_file(lease_id, path, file_content)
    except InfraError as exc:
        raise exc.at(InfraStage.REWARD, "writing reward files") from exc
    for step in spec.setup:
        request = ExecRequest(shell=step, timeout_s=spec.timeout_s, env=env, cwd=cwd, max_output_bytes=20_000)
        result = await broker.exec(lease_id, request, stage=InfraStage.REWARD)
        if result.exit_code != 0:
            why = "timed out" if result.timed_out else f"exited {result.exit_code}"
            message = f"reward setup {step[:200]!r} {why}: {(result.stdout + result.stderr)[-300:]}"
            raise InfraError(InfraStage.REWARD, ErrorCode.INTERNAL_ERROR, message)


REPORTED = ("pytest", "auto", "swebench")  # log parsers under which a pytest run gets the grader's plugin


def _swebench(log: str, parser: str) -> dict[str, str]:
    try:
        return swebench_parsers.parse(log, parser)
    except swebench_parsers.Unavailable as exc:
        raise InfraError(InfraStage.REWARD, ErrorCode.INTERNAL_ERROR, str(exc)) from exc


def with_plugin(command: str, report: str, directory: str = GRADER_DIR) -> str:
    """``command`` with pytest told to load the grader's plugin (and not to use its cache); the
    task's own ``PYTHONPATH``/``PYTEST_ADDOPTS`` are kept after the grader's."""
    exports = (
        f'export PYTHONPATH="{directory}${{PYTHONPATH:+:$PYTHONPATH}}"'
        f' PYTEST_ADDOPTS="-p {PLUGIN} -p no:cacheprovider${{PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}}"'
        f" ROLLOUT_PYTEST_REPORT={shlex.quote(report)}"
    )
    return f"{exports}\n{command}"


async def _install_plugin(broker: BrokerClient, lease_id: str) -> str:
    """Write the plugin; the path of this scoring's report (random, so no file left in advance counts)."""
    try:
        await broker.write_file(lease_id, f"{GRADER_DIR}/{PLUGIN}.py", PLUGIN_SOURCE)
    except InfraError as exc:
        raise exc.at(InfraStage.REWARD, "writing the grader's pytest plugin") from exc
    return f"{GRADER_DIR}/report-{uuid.uuid4().hex}.jsonl"


async def _read(broker: BrokerClient, lease_id: str, path: str) -> str | None:
    try:
        data = await broker.read_file(lease_id, path)
    except InfraError as exc:
        raise exc.at(InfraStage.REWARD, "reading the pytest report") from exc
    return None if data is None else data.decode(errors="replace")


def _check_runnable(result: ExecResult, log: str, output: str) -> None:
    why = CANNOT_RUN_EXIT_CODES.get(result.exit_code)
    if why is None and result.exit_code != 0 and RUNNER_BROKEN.search(log):
        why = "the test runner is missing or crashed"
    if why is not None:
        message = f"the reward command could not run ({why}, exit {result.exit_code}): {output[-300:]!r}"
        raise InfraError(InfraStage.REWARD, ErrorCode.INTERNAL_ERROR, message)

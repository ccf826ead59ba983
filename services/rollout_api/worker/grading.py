"""Grading in a fresh sandbox (``reward.grade_in: "fresh"``): the tests never run where the agent ran.

Before the agent's first turn the base commit of the repository at the working directory is read.
After its last turn the agent's change is taken as a diff against that commit (every file it
added, changed or removed; git's hooks, external diff drivers and text conversions off), its
sandbox is released (with whatever it left running), and a new sandbox is leased from the same
template and setup (a copy of the group's set-up sandbox where the backend forks). Only the paths
the rules allow are applied there: tests and test infrastructure (:func:`protected`), the task's
``restore`` entries, links and submodules always come from the image. The reward then runs in that
sandbox as it would have in the agent's. A change that cannot be taken or does not apply scores 0;
a sandbox without ``git`` is an infra error. The working directory must be the repository's root.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from fnmatch import fnmatch

from services.protocol import ErrorCode, InfraStage, RewardDetails, RewardSpec
from services.protocol.sandboxes import ExecRequest, ExecResult
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError

GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*' -c core.quotePath=true"
DIFF_OPTIONS = "--cached --binary --full-index --no-renames --no-ext-diff --no-textconv --no-color"
MAX_CHANGE_BYTES = 16_000_000
PATCH_PATH = "/tmp/rollout-grader/agent.patch"
# test infrastructure: read by pytest or by the interpreter at start-up, never taken from the agent
INFRA_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
    "pyproject.toml", "noxfile.py", "sitecustomize.py", "usercustomize.py",
})  # fmt: skip
TEST_DIRS = frozenset({"test", "tests"})
TEST_FILES = ("test_*.py", "*_test.py", "*_tests.py")
_SPECIAL_MODE = re.compile(r"^(?:new file|deleted file|new|old) mode 1[26]0000$", re.MULTILINE)  # link, submodule


@dataclass
class Change:
    """The agent's change as it will be applied, and what was left out of it."""

    patch: str
    dropped: list[str] = field(default_factory=list)


def protected(path: str, keep: list[str]) -> bool:
    """A path whose content always comes from the image (``keep``: the task's own list)."""
    parts = path.split("/")
    name = parts[-1]
    if parts[0] == ".git" or name in INFRA_NAMES or name.endswith(".pth"):
        return True
    if TEST_DIRS & set(parts[:-1]) or any(fnmatch(name, pattern) for pattern in TEST_FILES):
        return True
    return any(path == k or path.startswith(k + "/") for k in (posixpath.normpath(k) for k in keep))


def filter_patch(patch: str, keep: list[str]) -> Change:
    """The blocks of a ``git diff`` whose path may come from the agent."""
    change = Change(patch="")
    blocks = re.split(r"^(?=diff --git )", patch, flags=re.MULTILINE)
    for block in blocks:
        if not block.startswith("diff --git "):
            continue
        path = _block_path(block.split("\n", 1)[0])
        if path is None or protected(path, keep) or _SPECIAL_MODE.search(block):
            change.dropped.append(path or block.split("\n", 1)[0][:200])
        else:
            change.patch += block
    return change


def _block_path(header: str) -> str | None:
    """``diff --git a/P b/P`` -> P (without renames both sides are the same); None when quoted."""
    rest = header.removeprefix("diff --git ")
    size = (len(rest) - 5) // 2
    path = rest[2 : 2 + size]
    return path if size > 0 and rest == f"a/{path} b/{path}" else None


async def base_commit(broker: BrokerClient, lease_id: str, workdir: str, env: dict[str, str]) -> str:
    """The commit the agent starts from (read before its first turn)."""
    result = await _git(broker, lease_id, f"{GIT} rev-parse --verify HEAD", workdir, env, 60.0)
    commit = result.stdout.strip()
    if result.exit_code != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        message = f"grade_in 'fresh' needs a git repository at {workdir}: {(result.stdout + result.stderr)[-300:]}"
        raise InfraError(InfraStage.REWARD, ErrorCode.INTERNAL_ERROR, message)
    return commit


async def take_change(
    broker: BrokerClient, lease_id: str, base: str, workdir: str, env: dict[str, str], spec: RewardSpec
) -> Change | RewardDetails:
    """The agent's change (filtered), or the details of a 0 when it cannot be taken."""
    command = f"{GIT} add -A -- . && {GIT} diff {DIFF_OPTIONS} {shlex.quote(base)} --"
    result = await _git(broker, lease_id, command, workdir, env, spec.timeout_s, MAX_CHANGE_BYTES)
    if result.exit_code == 0 and not result.stdout_truncated and not result.timed_out:
        return filter_patch(result.stdout, spec.restore)
    why = "timed out" if result.timed_out else "too large" if result.stdout_truncated else f"exit {result.exit_code}"
    return RewardDetails(exit_code=None, output=f"the agent's change could not be taken ({why}): "
                         f"{result.stderr[-1000:]}")  # fmt: skip


async def apply_change(
    broker: BrokerClient, lease_id: str, change: Change, workdir: str, env: dict[str, str], timeout_s: float
) -> RewardDetails | None:
    """Apply the change in the grading sandbox; the details of a 0 when it does not apply."""
    if not change.patch:
        return None
    try:
        await broker.write_file(lease_id, PATCH_PATH, change.patch)
    except InfraError as exc:
        raise exc.at(InfraStage.REWARD, "writing the agent's change") from exc
    command = f"{GIT} apply --binary --whitespace=nowarn {PATCH_PATH}"
    result = await _git(broker, lease_id, command, workdir, env, timeout_s)
    if result.exit_code == 0:
        return None
    return RewardDetails(
        exit_code=result.exit_code, output=f"the agent's change did not apply: {result.stderr[-1000:]}"
    )


async def _git(
    broker: BrokerClient, lease_id: str, command: str, workdir: str, env: dict[str, str], timeout_s: float,
    max_output_bytes: int = 20_000,
) -> ExecResult:  # fmt: skip
    request = ExecRequest(shell=command, timeout_s=timeout_s, env=env, cwd=workdir, max_output_bytes=max_output_bytes)
    result = await broker.exec(lease_id, request, stage=InfraStage.REWARD)
    if result.exit_code in (126, 127):
        message = f"git cannot run for fresh grading (exit {result.exit_code}): {result.stderr[-300:]}"
        raise InfraError(InfraStage.REWARD, ErrorCode.INTERNAL_ERROR, message)
    return result

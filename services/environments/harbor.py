"""Harbor task directories (Terminal-Bench's format since 2.0; harborframework.com/docs/tasks).

A task directory holds ``task.toml`` (``[metadata]``, ``[verifier] timeout_sec / env / user``,
``[agent] timeout_sec``, ``[environment] build_timeout_sec / cpus / memory_mb / storage_mb /
allow_internet``; older files spell ``memory`` / ``storage`` as "2G"), ``instruction.md``,
``environment/Dockerfile`` and its build context, ``tests/test.sh`` and ``solution/solve.sh``.

Mapped onto a platform ``Task``: the instruction is the prompt; the image built from the
Dockerfile (harbor_images.py) is the sandbox's template, with the task's resources, and network
only when ``allow_internet``; ``tests/`` is written only at grading time (staged by the reward's
files, then moved to ``/tests``, so nothing the agent left there counts) and ``bash
/tests/test.sh`` runs with the verifier's env; the reward is the float ``test.sh`` writes to
``/logs/verifier/reward.txt`` (or the ``reward`` key of ``reward.json``). A missing reward file
is an infra error (the reward command exits non-zero without a float), never a 0.
``solution/solve.sh`` is the oracle (:func:`oracle_command`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.protocol import RewardSpec, SandboxSpec, Task

SOURCE = "harbor"
STAGE = "/tmp/rollout-harbor-tests"  # where the reward's files land before they become /tests
LOGS = "/logs/verifier"
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_AGENT_TIMEOUT_S = 600.0
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNITS_MB = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class HarborError(ValueError):
    """A task directory this adapter cannot run (the message names the task and what is missing)."""


@dataclass(frozen=True, slots=True)
class HarborTask:
    name: str  # the task id: ``[task] name`` (its last part), else the directory's name
    path: Path
    instruction: str
    config: dict[str, Any]  # task.toml, as parsed
    tests: dict[str, str]  # path under tests/ -> content
    solution: str | None  # solution/solve.sh
    notes: list[str] = field(default_factory=list)  # what the task asks for that is not carried

    @property
    def environment(self) -> Path:
        return self.path / "environment"

    def section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name) or {}
        return value if isinstance(value, dict) else {}


def load(path: Path) -> HarborTask:
    """Read one task directory; HarborError names what is missing or not supported."""
    path = path.resolve()
    if not (path / "task.toml").is_file():
        raise HarborError(f"{path}: no task.toml (not a Harbor task directory)")
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise HarborError(f"{path}/task.toml: {exc}") from exc
    for needed in ("instruction.md", "tests/test.sh"):
        if not (path / needed).is_file():
            raise HarborError(f"{path}: no {needed}")
    if not (path / "environment" / "Dockerfile").is_file():
        compose = any((path / "environment" / n).exists() for n in ("docker-compose.yaml", "docker-compose.yml"))
        why = "a docker-compose environment (several containers) is not supported" if compose else "no Dockerfile"
        raise HarborError(f"{path}: {why}")
    task_name = str((config.get("task") or {}).get("name") or path.name).rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", task_name).strip("-._")[:128] or "task"
    solve = path / "solution" / "solve.sh"
    task = HarborTask(name, path, (path / "instruction.md").read_text(), config, _text_files(path / "tests"),
                      solve.read_text() if solve.is_file() else None)  # fmt: skip
    user = task.section("verifier").get("user")
    if user not in (None, "root"):
        task.notes.append(f"{name}: [verifier] user = {user!r} is not honoured: the tests run as the image's user")
    return task


def _text_files(root: Path) -> dict[str, str]:
    found = {}
    for item in sorted(root.rglob("*")):
        if item.is_file():
            try:
                found[item.relative_to(root).as_posix()] = item.read_text()
            except UnicodeDecodeError as exc:
                raise HarborError(f"{item}: binary test files are not supported (text only)") from exc
    return found


def size_mb(value: Any, default: int) -> int:
    """``2048`` (MB) or Harbor's older ``"2G"`` / ``"512M"`` spellings, in MB."""
    if value is None:
        return default
    if isinstance(value, int | float):
        return max(1, int(value))
    match = _SIZE.match(str(value))
    if not match:
        raise HarborError(f"cannot read the size {value!r}")
    return max(1, int(float(match.group(1)) * _UNITS_MB[match.group(2).upper()]))


def reward_command(env: dict[str, Any]) -> str:
    """Run the tests (their output to stderr, kept in the reward's details), then print the reward
    the tests wrote; exit 3 without a float when they wrote none (an infra error)."""
    prefix = " ".join(f"{k}={_quote(str(v))}" for k, v in {"TEST_DIR": "/tests", **env}.items())
    runner = f"env {prefix} bash /tests/test.sh"
    return (
        f"{runner} 1>&2; "
        f"if [ -f {LOGS}/reward.txt ]; then tail -n 1 {LOGS}/reward.txt; echo; "
        f"elif [ -f {LOGS}/reward.json ]; then "
        f"sed -n 's/.*\"reward\"[[:space:]]*:[[:space:]]*\\([-+0-9.eE]*\\).*/\\1/p' {LOGS}/reward.json | head -n 1; "
        f'else echo "harbor: the tests wrote no {LOGS}/reward.txt or reward.json" >&2; exit 3; fi'
    )


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


STAGE_TESTS = (
    f"rm -rf /tests {LOGS} && mkdir -p {LOGS} && mv {STAGE} /tests && chmod -R a+rX /tests && chmod a+rwx {LOGS}"
)


def to_task(task: HarborTask, template: str, source_version: str) -> Task:
    environment, verifier = task.section("environment"), task.section("verifier")
    memory = size_mb(environment.get("memory_mb", environment.get("memory")), 2048)
    disk = size_mb(environment.get("storage_mb", environment.get("storage")), 10_240)
    return Task(
        id=task.name,
        prompt=task.instruction,
        sandbox=SandboxSpec(
            template=template,
            cpus=float(environment.get("cpus", 1)),
            memory_mb=memory,
            disk_mb=disk,
            network="egress" if environment.get("allow_internet", True) else "none",
            setup=["mkdir -p /logs/agent /logs/verifier"],
        ),  # fmt: skip
        reward=RewardSpec(
            command=reward_command(verifier.get("env") or {}),
            parse_float=True,
            timeout_s=float(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S)),
            files={f"{STAGE}/{rel}": content for rel, content in task.tests.items()},
            setup=[STAGE_TESTS],
        ),
        metadata={
            "harbor": {
                "path": str(task.path),
                "metadata": task.section("metadata"),
                "agent_timeout_s": agent_timeout_s(task),
            }
        },  # fmt: skip
        source=SOURCE,
        source_version=source_version,
    )


def agent_timeout_s(task: HarborTask) -> float:
    return float(task.section("agent").get("timeout_sec", DEFAULT_AGENT_TIMEOUT_S))


def oracle_command(task: HarborTask) -> str:
    """A shell command that runs the task's ``solution/solve.sh`` (Harbor's oracle agent) in the
    sandbox: the script is written to /solution and run with bash from the image's workdir."""
    if task.solution is None:
        raise HarborError(f"{task.name}: no solution/solve.sh")
    return f"mkdir -p /solution && cat > /solution/solve.sh <<'ROLLOUT_SOLVE_EOF'\n{task.solution.rstrip()}\n" \
        "ROLLOUT_SOLVE_EOF\nbash /solution/solve.sh"  # fmt: skip

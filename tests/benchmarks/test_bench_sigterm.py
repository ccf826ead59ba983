"""A benchmark ended by SIGTERM (``timeout``, a CI's cancel) stops what it started: its services run in
sessions of their own, so with SIGTERM's default action they, their sandboxes and their state
directory outlived it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.sandbox_broker.backends.leftovers import remove_state_dir
from tests.sandbox_broker.conftest import needs_bwrap
from tests.support.processes import REPO_ROOT, python_env

pytestmark = [needs_bwrap, pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300)]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def state_dir(pids: set[int]) -> Path:
    """The broker's ``--state-dir``, from its command line."""
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "broker" in argv and "--state-dir" in argv:
            return Path(argv[argv.index("--state-dir") + 1])
    raise AssertionError("no broker among the benchmark's processes")


def test_sigterm_stops_the_stack_and_removes_its_sandboxes() -> None:
    argv = ["bench", "capacity", "--in-flight", "2", "--check-in-flight", "0", "--short-in-flight", "0",
            "--time-scale", "50", "--warmup-s", "1", "--window-s", "120", "--idle-s", "1", "--workers", "1",
            "--proxy-workers", "1"]  # fmt: skip
    bench = subprocess.Popen([sys.executable, "-m", "services.cli", *argv], cwd=REPO_ROOT, env=python_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    started: set[int] = set()
    state: Path | None = None
    try:
        assert bench.stdout is not None
        lines = []
        for line in bench.stdout:  # the stack is up and episodes are in flight
            lines.append(line)
            if "measuring costs at N=2" in line:
                break
        else:
            raise AssertionError("".join(lines)[-3000:])
        deadline = time.monotonic() + 60
        while not any("bwrap" in _comm(p) for p in descendants(bench.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)  # a sandbox is up
        started = descendants(bench.pid)
        assert any("bwrap" in _comm(p) for p in started), "no sandbox started"
        state = state_dir(started)
        assert state.is_dir()
        bench.send_signal(signal.SIGTERM)
        rest, _ = bench.communicate(timeout=120)
        assert bench.returncode == 128 + signal.SIGTERM, rest[-3000:]
        left = sorted(p for p in started if alive(p))
        assert not left, [(_comm(p), p) for p in left]
        assert not state.exists() and not state.parent.exists()
    finally:  # what a failed run left is not left for the other tests
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if state is not None and state.exists():
            remove_state_dir(state)
            shutil.rmtree(state.parent, ignore_errors=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""

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


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command's name (state first), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def descendants(pid: int) -> set[tuple[int, int]]:
    """Every process below ``pid``, by parent pid, as (pid, start time): pids wrap (32,768 here, and
    a CI run starts over 100,000 processes), so a pid alone may name another test's process later."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child[0])
    return found


def alive(process: tuple[int, int]) -> bool:
    """Still running (not a zombie), and the same process: its start time unchanged."""
    fields = _stat(process[0])
    return fields is not None and fields[0] != "Z" and int(fields[19]) == process[1]


def state_dir(processes: set[tuple[int, int]]) -> Path:
    """The broker's ``--state-dir``, from its command line."""
    for pid, _ in processes:
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
    started: set[tuple[int, int]] = set()
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
        while not any("bwrap" in _comm(p) for p, _ in descendants(bench.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)  # a sandbox is up
        started = descendants(bench.pid)
        assert any("bwrap" in _comm(p) for p, _ in started), "no sandbox started"
        state = state_dir(started)
        assert state.is_dir()
        bench.send_signal(signal.SIGTERM)
        rest, _ = bench.communicate(timeout=120)
        assert bench.returncode == 128 + signal.SIGTERM, rest[-3000:]
        left = sorted(p for p in started if alive(p))
        assert not left, [(_comm(p), p) for p, _ in left]
        assert not state.exists() and not state.parent.exists()
    finally:  # what a failed run left is not left for the other tests
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for process in started:
            if alive(process):  # not another test's process that took a pid of the stack's
                os.kill(process[0], signal.SIGKILL)
        if state is not None and state.exists():
            remove_state_dir(state)
            shutil.rmtree(state.parent, ignore_errors=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""

"""Killing a sandbox's cgroups never signals a pid that left them: a pid read from ``cgroup.procs``
that is reaped and reused by another host process before the signal (pid_max 32768, fork bombs in
other sandboxes) must survive; one still listed is killed. A fake cgroup root (plain files) stands
in for /sys/fs/cgroup; the processes are real."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.sandbox_broker.backends.cgroups import V1_CONTROLLERS, Cgroups


def _groups(root: Path) -> Cgroups:
    groups = Cgroups("v1", scope="s", root=root)
    for d in groups.procs_files("box"):
        d.parent.mkdir(parents=True)
        d.write_text("")
    return groups


def test_a_pid_still_in_the_groups_is_killed(tmp_path: Path) -> None:
    groups = _groups(tmp_path)
    inside = subprocess.Popen(["sleep", "60"])
    try:
        for procs in groups.procs_files("box"):
            procs.write_text(f"{inside.pid}\n")
        assert groups.kill("box") == 1
        assert inside.wait(timeout=10) == -9
    finally:
        inside.kill()
        inside.wait(timeout=10)


def test_a_pid_that_left_the_groups_before_the_signal_is_not_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = _groups(tmp_path)
    bystander = subprocess.Popen(["sleep", "60"])  # the process that got a reaped sandbox process's pid
    first = groups.procs_files("box")
    for procs in first:
        procs.write_text(f"{bystander.pid}\n")
    later = [tmp_path / "later" / f"{i}.procs" for i in range(len(first))]
    for procs in later:  # the groups a moment later: the sandbox's process was reaped
        procs.parent.mkdir(exist_ok=True)
        procs.write_text("")
    reads = iter([first, later])
    monkeypatch.setattr(Cgroups, "procs_files", lambda self, sandbox_id: next(reads, later))
    try:
        assert groups.kill("box") == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)
    assert len(V1_CONTROLLERS) == len(first)

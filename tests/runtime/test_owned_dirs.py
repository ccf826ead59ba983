"""A scratch directory whose owner was killed is removed by the next owner of its prefix; one whose
owner runs (or that has no lock file) is not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.runtime.owned_dirs import LOCK, owned_tempdir, sweep
from tests.support.processes import REPO_ROOT, python_env

OWNER = """
import sys, time
from pathlib import Path
from services.runtime.owned_dirs import owned_tempdir
with owned_tempdir("scratch-", Path(sys.argv[1])) as path:
    print(path, flush=True)
    time.sleep(600)
"""


def _owner(base: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(base)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env=python_env())  # fmt: skip
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_owners_directory_goes_at_the_next_start_and_a_running_owners_stays(tmp_path: Path) -> None:
    running, kept = _owner(tmp_path)
    killed, left = _owner(tmp_path)
    try:
        assert kept.is_dir() and (kept / LOCK).is_file() and left.is_dir()
        (left / "counter_123.db").write_bytes(b"x")  # what the owner wrote there goes with it
        os.kill(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=10)
        assert left.is_dir()  # nothing ran at the kill

        with owned_tempdir("scratch-", tmp_path) as mine:
            assert not left.exists()
            assert kept.is_dir()  # its owner holds the lock
            assert Path(mine).is_dir() and sweep("scratch-", tmp_path) == 0  # so does this one
        assert not Path(mine).exists()
    finally:
        for proc in (running, killed):
            proc.kill()
            proc.communicate(timeout=10)
    assert sweep("scratch-", tmp_path) == 1 and not kept.exists()


def test_a_directory_without_a_lock_file_or_of_another_prefix_is_left_alone(tmp_path: Path) -> None:
    foreign = tmp_path / "scratch-made-by-someone-else"
    foreign.mkdir()
    other = tmp_path / "other-abc"
    other.mkdir()
    (other / LOCK).write_bytes(b"")  # unlocked, but not of this prefix
    with owned_tempdir("scratch-", tmp_path):
        pass
    assert foreign.is_dir() and other.is_dir()
    assert sweep("other-", tmp_path) == 1 and not other.exists()


def test_a_fork_of_the_owner_holds_the_directory_after_the_owner_is_killed(tmp_path: Path) -> None:
    """The proxy's workers are forks of its parent: while one lives on, its directory is in use."""
    fork = "    child = os.fork()\n    if child:\n        print(child, flush=True)\n    time.sleep(600)"
    script = OWNER.replace("    time.sleep(600)", fork)
    proc = subprocess.Popen([sys.executable, "-c", "import os" + script, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, env=python_env())  # fmt: skip
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    forked = int(proc.stdout.readline())
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert sweep("scratch-", tmp_path) == 0 and path.is_dir()
    finally:
        os.kill(forked, signal.SIGKILL)
        proc.communicate(timeout=10)  # the pipe's last writer was the fork
    for _ in range(200):  # the fork is not our child: wait until the kernel has closed its files
        if not Path(f"/proc/{forked}").exists():
            break
        time.sleep(0.05)
    assert sweep("scratch-", tmp_path) == 1 and not path.exists()

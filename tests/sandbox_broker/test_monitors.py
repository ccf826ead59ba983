"""The leftover-monitor check: a container monitor (containerd shim, conmon) under the engine's exec
root whose container is gone is found and killed; one whose container exists is left alone, also one
whose container was created after the caller first listed them (the list is asked for after /proc
is read)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.sandbox_broker.backends.monitors import leftover_monitors


def _fake_shim(exec_root: Path, container: str) -> subprocess.Popen[bytes]:
    argv = ["bash", "-c", f'exec -a containerd-shim-runc-v2 {sys.executable} -c "import time; time.sleep(60)" '
            f"-namespace moby -id {container} -address {exec_root}/containerd/containerd.sock"]  # fmt: skip
    return subprocess.Popen(argv)


def test_leftover_monitors_are_found_and_killed(tmp_path: Path) -> None:
    exec_root = tmp_path / "exec"
    orphan, kept = _fake_shim(exec_root, "a" * 64), _fake_shim(exec_root, "b" * 64)
    try:
        for _ in range(100):  # until both have exec'd under their new names
            if len(leftover_monitors(str(exec_root), set(), kill=False)) == 2:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        found = leftover_monitors(str(exec_root), {"b" * 64}, kill=True)
        assert found == [orphan.pid]
        assert orphan.wait(timeout=10) == -9
        assert kept.poll() is None
        assert leftover_monitors(str(tmp_path / "other-engine"), set(), kill=False) == []
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait(timeout=10)


def test_a_monitor_of_a_container_created_during_the_scan_is_spared(tmp_path: Path) -> None:
    exec_root = tmp_path / "exec"
    new = _fake_shim(exec_root, "c" * 64)
    try:
        for _ in range(100):
            if leftover_monitors(str(exec_root), set(), kill=False):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        listed_before: set[str] = set()  # the engine's list taken before the container existed

        def listed_after() -> set[str]:  # the engine's list once /proc was read: the container is there
            return {"c" * 64}

        assert leftover_monitors(str(exec_root), listed_after, kill=True) == []
        assert new.poll() is None
        assert leftover_monitors(str(exec_root), listed_before, kill=False) == [new.pid]  # the old race
    finally:
        new.kill()
        new.wait(timeout=10)

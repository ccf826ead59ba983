"""The fork server (services/runtime/forkserver.py): a forked service is what an exec'd
``python -m`` would be, and its caller's handle answers as ``subprocess.Popen`` does."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime import forkserver
from services.runtime.processes import REPO_ROOT, ServiceProcess, launch_service, python_env

PROBE = ["-m", "tests.support.forkprobe"]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server of this test's own, named in the environment as the suite's is."""
    path = Path(tempfile.mkdtemp(prefix="forkserver-test-")) / "socket"
    proc = forkserver.start(path, python_env(), REPO_ROOT)
    monkeypatch.setenv(forkserver.ENV, str(path))
    yield str(path)
    proc.kill()
    proc.wait()
    shutil.rmtree(path.parent, ignore_errors=True)


def probe(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> ServiceProcess:
    return launch_service([*PROBE, *args], log_dir=tmp_path, env=env, name="probe")


def report(service: ServiceProcess) -> dict[str, object]:
    out: dict[str, object] = json.loads(service.log().splitlines()[0])
    return out


def test_a_forked_service_is_what_an_exec_d_one_would_be(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_tmp = {"TMPDIR": str(tmp_path)}  # read at first use: the server's was /tmp
    forked = probe(tmp_path / "forked", "exit", "3", env=own_tmp)
    assert isinstance(forked.proc, forkserver.ForkedProcess)
    assert forked.proc.wait(timeout=30) == 3
    monkeypatch.delenv(forkserver.ENV)
    execd = probe(tmp_path / "execd", "exit", "3", env=own_tmp)
    assert isinstance(execd.proc, subprocess.Popen)
    assert execd.proc.wait(timeout=30) == 3
    got, want = report(forked), report(execd)
    # argv, sys.path[0], cwd, environment, session, open fds, stdin, signals, __main__, tmp dir, command line
    assert got == want
    assert want["session_leader"] and want["fds"] == [0, 1, 2, 3] and want["name"] == "__main__"  # 3: the listing
    assert want["stdin"] == "/dev/null" and forkserver.ENV not in want["env"]  # type: ignore[operator]
    assert want["tmp"] == str(tmp_path) and str(want["cmdline"]).split("\0")[1:4] == [*PROBE, "exit"]
    assert forked.log().endswith("to stderr\n")  # stdout and stderr in the log, in order


def test_a_forked_service_ends_as_an_interpreter_would(server: str, tmp_path: Path) -> None:
    failed, message, finishing = probe(tmp_path, "raise"), probe(tmp_path, "message"), probe(tmp_path, "atexit")
    assert failed.proc.wait(timeout=30) == 1 and "ValueError: probe failed" in failed.log()
    assert message.proc.wait(timeout=30) == 1 and message.log().endswith("a message\n")
    # its non-daemon threads are joined, then its atexit handlers run, as at an interpreter's end
    assert finishing.proc.wait(timeout=30) == 0 and finishing.log().endswith("thread finished\natexit ran\n")

    sleeping = probe(tmp_path, "sleep")
    assert sleeping.proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.proc.wait(timeout=0.2)
    sleeping.stop()  # SIGTERM to its process group
    assert sleeping.proc.returncode == -signal.SIGTERM and sleeping.proc.poll() == -signal.SIGTERM


def test_a_forked_service_starts_with_the_servers_heap_frozen(server: str, tmp_path: Path) -> None:
    """Its first full collection neither walks nor writes to the preloaded libraries' objects: unfrozen,
    it copied about 7,000 pages the service shared with the server."""
    service = probe(tmp_path, "gc")
    assert service.proc.wait(timeout=30) == 0
    got = json.loads(service.log().splitlines()[-1])
    assert got["frozen"] > 10_000, got  # fastapi, aiohttp, pydantic...: about 90,000
    assert got["collect_page_faults"] < 2_000, got


def test_a_service_whose_interpreter_settings_differ_is_exec_d(server: str, tmp_path: Path) -> None:
    service = probe(tmp_path, "exit", "0", env={"PYTHONHASHSEED": "7"})
    assert isinstance(service.proc, subprocess.Popen) and service.proc.wait(timeout=30) == 0
    assert json.loads(service.log().splitlines()[0])["env"]["PYTHONHASHSEED"] == "7"
    assert not forkserver.forkable([sys.executable, "-c", "pass"], python_env(), server)
    assert forkserver.forkable([sys.executable, *PROBE], python_env(), server)

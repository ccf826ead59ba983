"""The subprocess helper other tests build on: waits for /healthz, reports a crash with its log."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import launch_service, start_service


def test_waits_for_healthz_then_stops(tmp_path: Path, service_logs: Path) -> None:
    (tmp_path / "healthz").write_text("ok")
    svc = start_service(
        ["-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        log_dir=service_logs, name="static",
    )  # fmt: skip
    try:
        assert httpx.get(svc.url + "/healthz").text == "ok"
    finally:
        svc.stop()
    assert not svc.alive()


def test_a_service_that_dies_is_reported_with_its_log(service_logs: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        start_service(["-c", "import sys; print('boom'); sys.exit(3)"], log_dir=service_logs, timeout_s=5)


STUCK = """
import signal, sys, time
from services.runtime.logs import configure_logging

def stuck_in_its_shutdown():
    while True:
        time.sleep(0.05)

configure_logging()
signal.signal(signal.SIGTERM, lambda *_: stuck_in_its_shutdown())
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_service_that_outlives_its_stop_grace_leaves_its_stacks_in_its_log(service_logs: Path) -> None:
    svc = launch_service(["-c", STUCK], log_dir=service_logs, name="stuck")
    deadline = time.monotonic() + 30
    while "ready" not in svc.log():
        assert svc.alive() and time.monotonic() < deadline, svc.log()
        time.sleep(0.05)
    svc.stop(timeout_s=1.0)
    assert not svc.alive()
    log = svc.log()
    assert "(most recent call first)" in log, log  # faulthandler's dump, written before the SIGKILL
    assert "in stuck_in_its_shutdown" in log, log

"""The subprocess helper other tests build on: waits for /healthz, reports a crash with its log."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.processes import start_service


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

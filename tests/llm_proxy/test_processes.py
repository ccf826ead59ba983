"""Killing only the proxy's parent process (kill -9) takes its worker processes with it: none keeps
serving the port beside a restarted proxy. The metrics directory it leaves in the temp dir is removed
by the next proxy that starts there."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.llm_proxy.fleet import start_engines, start_proxy, wait_until

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_killing_the_parent_ends_its_workers(tmp_path: Path, redis_url: str) -> None:
    engine, urls = start_engines(tmp_path, 1)
    temp = tmp_path / "tmp"
    temp.mkdir()
    proxy = after = None
    try:
        proxy = start_proxy(tmp_path, redis_url, urls, env={"TMPDIR": str(temp)})
        workers = {httpx.get(proxy.url + "/healthz").json()["pid"] for _ in range(16)}
        assert workers and proxy.proc.pid not in workers
        (left,) = temp.glob("proxy-prom-*")
        os.kill(proxy.proc.pid, signal.SIGKILL)  # the parent only, not its process group
        proxy.proc.wait(timeout=10)
        wait_until(lambda: not any(_alive(pid) for pid in workers), 30, "the workers to end")
        assert left.is_dir()  # no `with` block ended: the killed parent's directory stays

        after = start_proxy(tmp_path, redis_url, urls, env={"TMPDIR": str(temp)})
        (mine,) = temp.glob("proxy-prom-*")
        assert mine != left and not left.exists()
        after.stop()
        assert not list(temp.glob("proxy-prom-*"))
    finally:
        for process in (proxy, after):
            if process is not None:
                process.stop()
        engine.stop()

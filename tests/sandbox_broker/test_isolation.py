"""What a local sandbox cannot do: see the host's processes, write outside its workspace, reach
loopback services (with its network off or on), keep processes alive past a timeout or a release.
The full escape suite, on both backends and both network modes, is test_escape.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.sandbox_broker.conftest import DEV_ENV, BrokerFactory, broker_args, lease, needs_bwrap, run
from tests.support.processes import start_service

pytestmark = needs_bwrap


FORK_BOMB = """
import os, time
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError:
    print("limited after", n, flush=True)
"""


def _host_processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _gone(marker: str, timeout_s: float = 10) -> bool:
    """No host process carries ``marker`` (killed processes leave /proc a moment after the kill)."""
    deadline = time.monotonic() + timeout_s
    while _host_processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _host_processes_with(marker) == []


def test_sandbox_is_isolated_from_the_host(start_broker: BrokerFactory, redis_url: str) -> None:
    broker = start_broker()
    redis_port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        lid = lease(client)["id"]
        who = run(client, lid, "id -u; grep CapEff /proc/self/status; ls /proc | grep -c '^[0-9]'")
        uid, caps, nprocs = who["stdout"].split("\n")[:3]
        assert uid == "1000" and caps.split()[1] == "0000000000000000"
        assert int(nprocs) < 10  # its own few processes, not the host's
        assert str(os.getpid()) not in run(client, lid, "ls /proc")["stdout"].split()

        for path in ("/usr/evil", "/etc/evil", "/evil", "/proc/sys/kernel/hostname"):
            wrote = run(client, lid, f"echo x > {path}")
            assert wrote["exit_code"] != 0, path
        assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()

        probe = f"exec 3<>/dev/tcp/127.0.0.1/{redis_port} && echo connected"
        offline = run(client, lid, probe)
        assert offline["exit_code"] != 0 and "connected" not in offline["stdout"]
        online_id = lease(client, network="egress")["id"]  # its own network namespace: not the host's loopback
        online = run(client, online_id, probe)
        assert online["exit_code"] != 0 and "connected" not in online["stdout"]

        other = lease(client)["id"]
        run(client, lid, "echo secret > /workspace/mine; echo t > /tmp/t")
        assert run(client, other, "cat /workspace/mine")["exit_code"] != 0
        assert run(client, other, "ls /tmp")["stdout"] == ""


def test_timeouts_and_release_kill_the_whole_process_tree(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    marker = f"{int(time.time() * 1000) % 100000 + 200000}"
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        lid = lease(client)["id"]
        command = f"(setsid sleep {marker} &); (sleep {marker}1 &); sleep {marker}2"
        result = run(client, lid, command, timeout_s=1)
        assert result["timed_out"] is True and result["exit_code"] == 124, result
        assert _gone(f"sleep\0{marker}")

        # a command that finishes takes its background children with it (the kernel ends its pid namespace)
        run(client, lid, f"sleep {marker}3 & echo started")
        assert _gone(f"sleep\0{marker}3")

        # limits: the pids cgroup stops a fork bomb from taking the host down
        bomb = run(client, lid, f"python3 -c '{FORK_BOMB}'", timeout_s=30)
        assert bomb["stdout"].startswith("limited after")
        assert int(bomb["stdout"].split()[2]) < 600
        assert client.delete(f"/leases/{lid}").status_code == 204


def test_refuses_to_run_unisolated_unless_told(
    redis_url: str, state_dir: Path, service_logs: Path, tmp_path: Path
) -> None:
    no_bwrap = tmp_path / "bin"  # a PATH on which bubblewrap cannot be found
    no_bwrap.mkdir()
    env = {"PATH": str(no_bwrap), **DEV_ENV}  # a development broker (no tokens), as the other tests start
    args = broker_args(redis_url, state_dir, "unsafe")
    with pytest.raises(RuntimeError, match="cannot be isolated"):
        start_service(args, log_dir=service_logs, env=env, name="refused", timeout_s=30)
    unsafe = start_service([*args, "--allow-unisolated"], log_dir=service_logs, env=env, name="unsafe")
    try:
        isolation = httpx.get(unsafe.url + "/healthz").json()["isolation"]
        assert isolation["isolated"] is False and isolation["unsafe_unisolated"] is True
        with httpx.Client(base_url=unsafe.url, timeout=30) as client:
            lid = lease(client)["id"]
            assert run(client, lid, "echo runs")["stdout"] == "runs\n"
            client.delete(f"/leases/{lid}")
    finally:
        unsafe.stop()
    assert "UNSAFE" in unsafe.log()

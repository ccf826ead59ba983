"""The benches' CPU readers: a service's process tree holds the descendants that started sessions of
their own (a broker's agent zygote), with the children they reaped; its session alone does not."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from services.benchmarks.procstat import (
    host_cpu_ticks,
    processes,
    session_cpu_s,
    settle,
    tree_total_cpu_s,
    trees_total_cpu_s,
)

# a service (its own session) whose helper starts a session of its own, reaps a child that burned
# CPU and stays alive, as the zygote does with an exec agent and its commands
SERVICE = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
time.sleep(60)
"""
BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"
HELPER = f"""
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "{BURN}"])
print("reaped", flush=True)
time.sleep(60)
"""


def test_a_tree_counts_a_helper_in_its_own_session_and_what_it_reaped() -> None:
    service = subprocess.Popen([sys.executable, "-c", SERVICE, HELPER], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while tree_total_cpu_s(service.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = trees_total_cpu_s({service.pid: "service"})["service"]
        session = session_cpu_s({service.pid: "service"})["service"]
        assert tree >= 0.4, tree  # the grandchild's 0.4 s, reaped by the helper, which is still alive
        assert session < tree - 0.3, (session, tree)  # the helper's session is not the service's
    finally:  # the helper's session, then the service's
        for leader in [p.pid for p in processes() if p.ppid == service.pid] + [service.pid]:
            subprocess.run(["pkill", "-9", "-s", str(leader)], check=False)
        service.kill()
        service.wait()


def test_settling_waits_out_busy_cores_until_its_timeout() -> None:
    """Spinners on every core keep the host busy: the wait lasts its whole timeout and says how busy."""
    spin = "while True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(len(os.sched_getaffinity(0)))]
    try:
        busy, total = host_cpu_ticks()
        assert 0 <= busy <= total
        waited, busy_share = asyncio.run(settle(max_busy=0.5, window_s=0.2, timeout_s=1.0))
        assert waited >= 1.0 and busy_share >= 0.5, (waited, busy_share)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()

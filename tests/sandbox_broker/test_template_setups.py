"""A template's setup runs once per resources, network and isolation: the first sandbox runs it, the
others start from a copy of its result (as a container image's layers are built once), each its own
from there on. ``share_setup: false`` runs it in every sandbox. A sandbox forked from a lease's
set-up sandbox does not run its template's setup again: the copy holds its result."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.sandbox_broker.backends import snapshots
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run

# not idempotent: run a second time over its own result, it fails (mkdir without -p)
SETUP = ["mkdir repo && date +%s%N > repo/stamp"]
SMALL = {"cpus": 0.5, "memory_mb": 512, "disk_mb": 256}


def _setups(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r'^rollout_broker_template_setups_total\{outcome="(\w+)"\} (\S+)$',
                                                    text, re.MULTILINE)}  # fmt: skip


def _leases(client: httpx.Client, n: int, **body: Any) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(n) as pool:  # at once: the others wait for the first's setup
        return list(pool.map(lambda _: lease(client, wait_s=60, **body), range(n)))


@needs_bwrap
def test_a_templates_setup_runs_once_and_its_sandboxes_start_from_its_result(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        assert client.post("/templates", json={"name": "built", "setup": SETUP}).status_code == 201
        group = _leases(client, 4, template="built", resources=SMALL)
        stamps = {run(client, held["id"], "cat repo/stamp")["stdout"] for held in group}
        assert len(stamps) == 1, stamps  # one run of the setup, four copies of its result
        assert _setups(client) == {"ran": 1.0, "shared": 3.0}

        run(client, group[0]["id"], "echo mine > repo/stamp")  # each copy is the sandbox's own
        assert run(client, group[1]["id"], "cat repo/stamp")["stdout"] == stamps.pop()

        other = lease(client, template="built", resources={**SMALL, "disk_mb": 300})  # another key: its own run
        assert run(client, other["id"], "cat repo/stamp")["exit_code"] == 0
        assert _setups(client) == {"ran": 2.0, "shared": 3.0}
        for held in [*group, other]:
            assert client.delete(f"/leases/{held['id']}").status_code == 204


@needs_bwrap
def test_a_template_that_does_not_share_runs_its_setup_in_every_sandbox(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        template = {"name": "each", "setup": SETUP, "share_setup": False}
        assert client.post("/templates", json=template).status_code == 201
        group = _leases(client, 3, template="each", resources=SMALL)
        stamps = {run(client, held["id"], "cat repo/stamp")["stdout"] for held in group}
        assert len(stamps) == 3, stamps
        assert _setups(client) == {"own": 3.0}
        for held in group:
            assert client.delete(f"/leases/{held['id']}").status_code == 204


@needs_bwrap
@pytest.mark.parametrize("share", [True, False])
def test_a_forked_sandbox_does_not_run_its_templates_setup_again(start_broker: BrokerFactory, share: bool) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        template = {"name": "forked", "setup": SETUP, "share_setup": share}
        assert client.post("/templates", json=template).status_code == 201
        setup = {"key": "rollout-1", "commands": ["echo task > task.txt"]}
        group = _leases(client, 3, template="forked", resources=SMALL, setup=setup)
        assert sorted(held["setup_shared"] for held in group) == [False, True, True]
        outputs = {run(client, held["id"], "cat repo/stamp task.txt")["stdout"] for held in group}
        assert len(outputs) == 1 and outputs.pop().endswith("task\n")
        for held in group:
            assert client.delete(f"/leases/{held['id']}").status_code == 204


def test_a_starting_broker_removes_only_the_snapshots_of_processes_that_are_gone(tmp_path: Path) -> None:
    """Several processes may share a state directory (replicas, a benchmark's backend beside its broker):
    a start removes a killed one's snapshots, not those a live one starts its sandboxes from."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    with subprocess.Popen(["sleep", "30"]) as alive:
        try:
            names = [f"snap-{alive.pid}-aa", f"snap-{ended.pid}-bb", "snap-cc"]  # the last: an older broker's
            for name in names:
                (snapshots.root(tmp_path) / name / "workspace").mkdir(parents=True)
            snapshots.clean(tmp_path)
            assert sorted(p.name for p in snapshots.root(tmp_path).iterdir()) == [names[0]]
        finally:
            alive.kill()

"""Sandbox fork for groups: eight leases of one setup key pay a 5 s setup once. The first runs it;
the other seven start from a copy of its sandbox (files, deletions, the overlay's upper layer), and
the setup seconds the broker accounts for, summed over the group, are about 5, not 40."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run

pytestmark = [needs_bwrap, pytest.mark.slow]

SETUP_S = 5.0
SETUP = {
    "key": "rollout-1",
    "files": {"task.txt": "the task\n"},
    "commands": [f"sleep {SETUP_S:g}; echo built > build.txt; rm task.txt; mkdir -p repo && echo v1 > repo/main.py"],
}


def test_a_group_of_8_pays_its_setup_once(start_broker: BrokerFactory, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "repo").mkdir(parents=True)
    (rootfs / "repo" / "old.py").write_text("seed\n")
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        assert client.post("/templates", json={"name": "seeded", "rootfs": str(rootfs)}).status_code == 201
        body = {"template": "seeded", "setup": SETUP, "wait_s": 60}
        with ThreadPoolExecutor(8) as pool:
            group: list[dict[str, Any]] = list(pool.map(lambda _: lease(client, **body), range(8)))
        assert sorted(held["setup_shared"] for held in group) == [False] + [True] * 7
        total = sum(held["setup_s"] for held in group)
        assert SETUP_S <= total < 2 * SETUP_S, [held["setup_s"] for held in group]  # about 5 s, not 40

        for held in group:  # every sandbox is the set-up one, and its own from there on
            state = run(client, held["id"], "cat build.txt repo/main.py repo/old.py; ls task.txt 2>&1")
            assert state["stdout"].splitlines()[:3] == ["built", "v1", "seed"] and "No such file" in state["stdout"]
        run(client, group[0]["id"], "echo mine > repo/main.py")
        assert run(client, group[1]["id"], "cat repo/main.py")["stdout"] == "v1\n"

        other_job = lease(client, **body, job="another-job")  # a key never crosses jobs
        assert other_job["setup_shared"] is False and other_job["setup_s"] >= SETUP_S
        failing = client.post("/leases", json={"setup": {"key": "bad", "commands": ["exit 7"]}})
        assert failing.status_code >= 500 and "exited 7" in failing.json()["error"]["message"]
        for held in [*group, other_job]:
            assert client.delete(f"/leases/{held['id']}").status_code == 204

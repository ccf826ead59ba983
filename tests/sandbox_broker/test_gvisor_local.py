"""``isolation: "gvisor"`` on the local backend: the field's validation, the refusal where runsc cannot
run, and a gVisor lease's commands, files, timeouts and exec agent. The escape and exhaustion
probes on gVisor are in test_escape.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, Resources, Template
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import gvisor
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.broker import Broker
from services.sandbox_broker.settings import BrokerSettings
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run
from tests.sandbox_broker.dockerd import runsc_problem
from tests.sandbox_broker.images_support import busybox_image


def test_an_unknown_isolation_is_a_422_naming_the_field(start_broker: BrokerFactory) -> None:
    broker = start_broker("--allow-unisolated")
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        for path, body in (("/leases", {"isolation": "vm"}), ("/templates", {"name": "t", "isolation": "vm"})):
            answer = client.post(path, json=body)
            assert answer.status_code == 422, answer.text
            error = answer.json()["error"]
            assert error["code"] == "validation_error" and error["field"] == "isolation", error
        levels = client.get("/healthz").json()["isolation"]["isolation_levels"]
        assert set(levels) == {"namespaces", "gvisor"}


async def test_gvisor_without_runsc_is_a_422_saying_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    levels = {"namespaces": ""}
    level = gvisor.GvisorLevel()
    level.start(tmp_path / "probe", 1000, levels)
    assert levels["gvisor"] == "runsc not found (apt-get install runsc)"
    with pytest.raises(PlatformError) as refused:
        await level.ready()  # a create that got past the broker's check
    assert refused.value.code == ErrorCode.VALIDATION_ERROR and refused.value.field == "isolation"
    broker = SimpleNamespace(capabilities={"isolation_levels": levels}, backend=SimpleNamespace(name="local"))
    with pytest.raises(PlatformError) as refused:
        Broker.check_isolation(broker, "gvisor")  # type: ignore[arg-type]
    assert "runsc not found" in refused.value.message and refused.value.field == "isolation"
    Broker.check_isolation(broker, "namespaces")  # type: ignore[arg-type]
    with pytest.raises(PlatformError, match="has no isolation 'gvisor'"):  # e2b: nothing to choose
        e2b = SimpleNamespace(capabilities={}, backend=SimpleNamespace(name="e2b"))
        Broker.check_isolation(e2b, "gvisor")  # type: ignore[arg-type]


@needs_bwrap
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gvisor_lease_runs_its_commands_in_gvisor(start_broker: BrokerFactory) -> None:
    if problem := runsc_problem():
        pytest.skip(problem)
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        template = {"name": "gv", "isolation": "gvisor", "warm_pool": 1}
        assert client.post("/templates", json=template).status_code == 201
        gv = lease(client, template="gv")
        assert run(client, gv["id"], "uname -r; id -u")["stdout"] == "4.4.0\n1000\n"  # gVisor's kernel
        assert client.put(f"/leases/{gv['id']}/files", params={"path": "in.txt"}, content=b"from the host\n").is_success
        both = run(client, gv["id"], "cat in.txt; echo made > out.txt")
        assert both["stdout"] == "from the host\n"
        assert client.get(f"/leases/{gv['id']}/files", params={"path": "out.txt"}).content == b"made\n"
        slow = run(client, gv["id"], "sleep 30 & echo started; sleep 30", timeout_s=2)
        assert slow["timed_out"] and slow["exit_code"] == 124 and slow["stdout"] == "started\n"
        assert run(client, gv["id"], "echo after")["stdout"] == "after\n"  # the sandbox outlives a timeout
        plain = lease(client, template="gv", isolation="namespaces")  # the lease's level over the template's
        assert not plain["warm"]
        assert run(client, plain["id"], "uname -r")["stdout"] != "4.4.0\n"
        other = lease(client, isolation="gvisor")  # the default template, asked for gVisor
        assert run(client, other["id"], "cat /workspace/in.txt 2>&1; uname -r")["stdout"].endswith("4.4.0\n")
        setup = {"key": "group-1", "commands": ["echo seeded > s.txt"]}  # a group's setup runs once, then forks
        first, second = (lease(client, template="gv", setup=setup) for _ in range(2))
        assert (first["setup_shared"], second["setup_shared"]) == (False, True)
        assert run(client, second["id"], "cat s.txt; uname -r")["stdout"] == "seeded\n4.4.0\n"
        assert client.delete(f"/leases/{gv['id']}").status_code == 204
        deadline = time.monotonic() + 30
        while _host_processes_with(gv["sandbox_id"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _host_processes_with(gv["sandbox_id"]) == []  # runsc, its sandbox and gofer: gone


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


@needs_bwrap
def test_a_task_image_on_gvisor(tmp_path: Path, state_dir: Path) -> None:
    """The image's overlay as gVisor's root, its user, workdir and env; private upper layers; the
    file routes; with the host's /usr, python3 and the exec agent inside."""
    if problem := runsc_problem():
        pytest.skip(problem)
    image = busybox_image(tmp_path / "img")

    async def scenario() -> None:
        backend = LocalBackend(BrokerSettings(state_dir=state_dir))
        await backend.start()
        spec = SandboxSpec(Template(name="bb", image=str(image), isolation="gvisor"), Resources())
        one, two = await backend.create(spec), await backend.create(spec)

        async def sh(sandbox_id: str, command: str) -> str:
            result = await backend.exec(sandbox_id, ExecRequest(shell=command))
            assert result.exit_code == 0, result.stderr
            return result.stdout

        out = await sh(one.sandbox_id, 'uname -r; id -un; pwd; echo "$FOO $HOME"; ls /testbed')
        assert out.splitlines() == ["4.4.0", "agent", "/testbed", "from-image /home/agent", "a.txt", "pkg"]
        await sh(one.sandbox_id, "echo mine > /etc/note; rm a.txt")
        assert await sh(two.sandbox_id, "ls") == "a.txt\npkg\n"  # private upper layers
        await backend.write_file(one.sandbox_id, "pkg/w.py", b"w")
        assert await sh(one.sandbox_id, "cat pkg/w.py") == "w"
        assert await backend.read_file(one.sandbox_id, "/etc/note") == b"mine\n"
        with_usr = SandboxSpec(Template(name="bb-usr", image=str(image), host_usr=True, isolation="gvisor"),
                               Resources())  # fmt: skip
        three = await backend.create(with_usr)
        assert three.sandbox_id not in backend.agents.agents  # no resident agent on gVisor (gvisor.py)
        assert await sh(three.sandbox_id, "/usr/bin/python3 -c 'import os; print(os.uname().release)'") == "4.4.0\n"
        for sandbox in (one, two, three):
            await backend.destroy(sandbox.sandbox_id)
        await backend.close()

    asyncio.run(scenario())

"""The lease life cycle on the local backend through HTTP: create, exec, files, archives, stream,
renew, list, release, and the error taxonomy of each route."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import httpx

from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run

pytestmark = needs_bwrap


def test_lease_exec_files_and_release(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        held = lease(client, job="job-a", labels={"episode": "7"})
        assert held["backend"] == "local" and held["job"] == "job-a" and held["workdir"] == "/workspace"
        lid = held["id"]

        failed = run(client, lid, "echo out; echo err >&2; exit 3")
        assert (failed["exit_code"], failed["stdout"], failed["stderr"]) == (3, "out\n", "err\n")
        assert failed["timed_out"] is False and failed["broker_s"] >= failed["duration_s"] > 0

        # the command's own CPU (with the children it waited for), not its wall time; counted in /metrics
        busy = run(client, lid, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; (sleep 0.3)")
        idle = run(client, lid, "sleep 0.5")
        assert busy["cpu_s"] >= 0.1 and busy["cpu_s"] <= busy["duration_s"] + 0.05, busy
        assert idle["cpu_s"] < 0.1 < 0.5 <= idle["duration_s"], idle
        assert _counter(client.get("/metrics").text, 'rollout_broker_command_cpu_seconds_total{backend="local"}') >= (
            busy["cpu_s"] + idle["cpu_s"]
        )

        argv = client.post(f"/leases/{lid}/exec", json={"argv": ["cat"], "stdin": "piped", "env": {"X": "1"}}).json()
        assert argv["stdout"] == "piped" and argv["exit_code"] == 0
        env = run(client, lid, 'echo "$X $HOME $(pwd)"', env={"X": "42"}, cwd="/tmp")
        assert env["stdout"] == "42 /workspace /tmp\n"

        capped = run(client, lid, "head -c 5000 /dev/zero | tr '\\0' a", max_output_bytes=100)
        assert capped["stdout"] == "a" * 100 and capped["stdout_truncated"] is True

        put = client.put(f"/leases/{lid}/files", params={"path": "src/app.py"}, content=b"print(6*7)\n")
        assert put.status_code == 204
        assert run(client, lid, "python3 src/app.py")["stdout"] == "42\n"
        run(client, lid, "echo made > /workspace/out.txt")
        assert client.get(f"/leases/{lid}/files", params={"path": "/workspace/out.txt"}).content == b"made\n"

        tar = _tar({"pkg/a.txt": b"A", "pkg/b/c.txt": b"C"})
        assert client.put(f"/leases/{lid}/archive", params={"path": "/workspace/repo"}, content=tar).status_code == 204
        assert run(client, lid, "cat repo/pkg/a.txt repo/pkg/b/c.txt")["stdout"] == "AC"
        packed = client.get(f"/leases/{lid}/archive", params={"path": "repo"}).content
        with tarfile.open(fileobj=io.BytesIO(packed)) as back:
            assert "./pkg/b/c.txt" in back.getnames()

        streamed = client.post(f"/leases/{lid}/exec/stream", json={"shell": "echo one; echo two >&2"})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert {e["stream"] for e in events[:-1]} == {"stdout", "stderr"}
        assert events[-1]["result"]["exit_code"] == 0 and events[-1]["result"]["stdout"] == "one\n"

        renewed = client.post(f"/leases/{lid}/renew", json={"ttl_s": 900}).json()
        assert renewed["expires_at"] > held["expires_at"]
        assert [x["id"] for x in client.get("/leases", params={"job": "job-a"}).json()] == [lid]
        assert client.get("/leases", params={"job": "job-b"}).json() == []

        assert client.delete(f"/leases/{lid}").status_code == 204
        assert client.delete(f"/leases/{lid}").status_code == 204  # idempotent
        gone = client.post(f"/leases/{lid}/exec", json={"shell": "true"})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "lease_not_found"


def test_errors_say_whose_fault_they_are(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        unknown = client.post("/leases", json={"template": "nope"})
        assert unknown.status_code == 400
        assert unknown.json()["error"] == {"code": "unknown_template", "message": "no template 'nope'",
                                           "infra": False, "field": "template", "retry_after_s": None}  # fmt: skip
        invalid = client.post("/leases", json={"ttl_s": -1})
        assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "validation_error"
        assert invalid.json()["error"]["field"] == "ttl_s"

        lid = lease(client)["id"]
        both = client.post(f"/leases/{lid}/exec", json={"shell": "true", "argv": ["true"]})
        assert both.status_code == 422 and both.json()["error"]["code"] == "validation_error"
        outside = client.put(f"/leases/{lid}/files", params={"path": "/etc/passwd"}, content=b"x")
        assert outside.status_code == 400 and outside.json()["error"]["field"] == "path"
        run(client, lid, "ln -s /etc /workspace/host-etc")
        escape = client.get(f"/leases/{lid}/files", params={"path": "host-etc/hostname"})
        assert escape.status_code == 400 and "outside" in escape.json()["error"]["message"]
        missing = client.get(f"/leases/{lid}/files", params={"path": "nope.txt"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

        templates = client.get("/templates").json()
        assert [t["name"] for t in templates] == ["default"]
        for rootfs in ("/nonexistent", "relative", "/root", "/tmp/../root"):  # missing, or outside the roots
            bad = client.post("/templates", json={"name": "x", "rootfs": rootfs})
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "rootfs", bad.text
        assert client.post("/leases", json={"template": "x"}).json()["error"]["code"] == "unknown_template"
        client.delete(f"/leases/{lid}")


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_template_rootfs_is_layered_under_a_private_workspace(
    start_broker: BrokerFactory, state_dir: Path, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "repo").mkdir(parents=True)
    (rootfs / "repo" / "main.py").write_text("print('v1')\n")
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        isolation = client.get("/healthz").json()["isolation"]
        layered, quota = isolation["overlayfs"], isolation["disk_quota"] == "loop-ext4"
        assert client.post("/templates", json={"name": "repo", "rootfs": str(rootfs)}).status_code == 201
        first, second = lease(client, template="repo"), lease(client, template="repo")
        assert run(client, first["id"], "python3 repo/main.py")["stdout"] == "v1\n"
        run(client, first["id"], "echo \"print('v2')\" > repo/main.py && touch repo/new.txt")
        assert run(client, first["id"], "python3 repo/main.py")["stdout"] == "v2\n"
        assert run(client, second["id"], "python3 repo/main.py; ls repo")["stdout"] == "v1\nmain.py\n"
        assert (rootfs / "repo" / "main.py").read_text() == "print('v1')\n"  # the template is untouched
        assert _mounts_under(state_dir) == (2 if layered else 0) + (2 if quota else 0)  # overlay, disk
        for held in (first, second):
            client.delete(f"/leases/{held['id']}")
        assert _mounts_under(state_dir) == 0


def _mounts_under(path: Path) -> int:
    with open("/proc/self/mountinfo") as mountinfo:
        return sum(1 for line in mountinfo if line.split()[4].startswith(str(path)))


def _counter(text: str, series: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series + " "))


def test_a_broker_started_under_a_strict_umask_serves_sandboxes_as_under_the_default(
    start_broker: BrokerFactory,
) -> None:
    """A hardened shell's umask (077) is not the sandboxes': the broker starts, its sandbox reads its
    /etc and writes its workspace, and its commands run under 022 as a container's do."""
    before = os.umask(0o077)
    try:
        broker = start_broker()  # the broker inherits 077
    finally:
        os.umask(before)
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        lid = lease(client)["id"]
        got = run(client, lid, "umask; id -un; echo x > f && ls -l f | cut -c1-10")
        assert (got["exit_code"], got["stdout"].split()) == (0, ["0022", "sandbox", "-rw-r--r--"]), got
        assert client.delete(f"/leases/{lid}").status_code in (200, 204)

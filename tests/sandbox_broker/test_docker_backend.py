"""The docker backend against a real dockerd started on a private socket (skipped where it cannot start)."""

from __future__ import annotations

import http.server
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import dockerfiles
from services.sandbox_broker.backends.docker_agents import GATEWAY_ROOT
from tests.sandbox_broker.conftest import BrokerFactory, docker_env, lease, run
from tests.sandbox_broker.dockerd import IMAGE, Dockerd, import_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_docker_lease_exec_files_and_release(dockerd: Dockerd, start_broker: BrokerFactory) -> None:
    broker = start_broker("--backend", "docker", "--warm-pool", "1", env=docker_env(dockerd))
    engine = docker.DockerClient(base_url=dockerd.url)
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        held = lease(client, job="dj")
        container = engine.containers.get(held["sandbox_id"])
        assert container.labels["rollout.broker"] == "b1" and container.attrs["HostConfig"]["Init"] is True
        assert container.attrs["HostConfig"]["PidsLimit"] == 512 and container.attrs["HostConfig"]["CapDrop"] == ["ALL"]
        assert run(client, held["id"], "ulimit -Sc; ulimit -Hc")["stdout"] == "0\n0\n"  # no core dumps

        result = run(client, held["id"], "echo out; echo err >&2; exit 3")
        assert (result["exit_code"], result["stdout"], result["stderr"]) == (3, "out\n", "err\n")
        piped = client.post(f"/leases/{held['id']}/exec", json={"argv": ["cat"], "stdin": "in"}).json()
        assert piped["stdout"] == "in"
        slow = run(client, held["id"], "sleep 30", timeout_s=1)
        assert slow["timed_out"] is True and slow["exit_code"] == 124

        client.put(f"/leases/{held['id']}/files", params={"path": "d/f.txt"}, content=b"data")
        assert run(client, held["id"], "cat /workspace/d/f.txt")["stdout"] == "data"
        assert client.get(f"/leases/{held['id']}/files", params={"path": "d/f.txt"}).content == b"data"
        missing = client.get(f"/leases/{held['id']}/files", params={"path": "nope"})
        assert missing.status_code == 404
        _files_in_the_containers_own_view(client, engine, held)

        deadline = time.monotonic() + 30
        while sum(client.get("/healthz").json()["pools"].values()) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        warm = lease(client, job="dj")
        assert warm["warm"] is True
        for item in (held, warm):
            assert client.delete(f"/leases/{item['id']}").status_code == 204
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(held["sandbox_id"])
    broker.stop()
    assert engine.containers.list(all=True) == []  # the pool went with the broker
    engine.close()


def test_docker_reaper_removes_orphans_including_created(dockerd: Dockerd, start_broker: BrokerFactory) -> None:
    engine = docker.DockerClient(base_url=dockerd.url)
    labels = {"rollout.broker": "gone-replica", "rollout.lease": "lse-never-recorded"}
    created = engine.containers.create(IMAGE, ["sleep", "1000"], labels=labels)  # stuck in "Created"
    running = engine.containers.run(IMAGE, ["sleep", "1000"], labels=labels, detach=True, network_mode="none")
    unrelated = engine.containers.create(IMAGE, ["sleep", "1000"])  # not ours: never touched
    assert engine.containers.get(created.id).status == "created"
    start_broker("--backend", "docker", env=docker_env(dockerd))
    remaining = {c.id for c in engine.containers.list(all=True)}
    assert created.id not in remaining and running.id not in remaining and unrelated.id in remaining
    unrelated.remove(force=True)
    engine.close()


def _files_in_the_containers_own_view(client: httpx.Client, engine: docker.DockerClient, held: dict[str, str]) -> None:
    """The file routes see what the container's commands see: its own tmpfs /tmp (the engine's
    archive API saw the directory under it), and files after the engine's host-side mount of the
    container's root is gone (the archive API answered 404 for every path then)."""
    files = f"/leases/{held['id']}/files"
    assert client.put(files, params={"path": "/tmp/test.patch"}, content=b"patch").status_code == 204
    assert run(client, held["id"], "cat /tmp/test.patch; echo mine > /tmp/mine")["stdout"] == "patch"
    assert client.get(files, params={"path": "/tmp/mine"}).content == b"mine\n"
    merged = engine.api.inspect_container(held["sandbox_id"])["GraphDriver"]["Data"]["MergedDir"]
    subprocess.run(["umount", "-l", merged], check=False)  # gone already on a busy host
    assert client.put(files, params={"path": "/testbed/tests/t.py"}, content=b"t").status_code == 204
    assert run(client, held["id"], "cat /testbed/tests/t.py")["stdout"] == "t"
    assert client.get(files, params={"path": "/testbed/tests/t.py"}).content == b"t"
    assert client.get(files, params={"path": "/testbed"}).status_code == 400  # a directory


PASSWD = b"root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/testbed:/bin/sh\n"


def test_docker_honours_the_images_workdir_env_and_named_user(dockerd: Dockerd, start_broker: BrokerFactory) -> None:
    """An image's WorkingDir, Env and User (a name) hold for commands and the file routes, also once
    the engine's host-side mount of the container's root is gone: the engine looked a named exec
    user up there, and every exec (the reward, the file routes' restore writes) then failed with
    exit 126 "unable to find user" (a 400 on a file write, never retried)."""
    engine = docker.DockerClient(base_url=dockerd.url)
    files = {"etc/passwd": (PASSWD, 0), "testbed": (None, 1000)}
    import_image(engine, "rollout/named-user:test", files, ["USER sandbox", "WORKDIR /testbed", "ENV FOO=bar"])
    env = docker_env(dockerd, ROLLOUT_BROKER_DOCKER_IMAGE="rollout/named-user:test")
    broker = start_broker("--backend", "docker", env=env)
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        held = lease(client, job="dj")
        assert held["workdir"] == "/testbed"
        merged = engine.api.inspect_container(held["sandbox_id"])["GraphDriver"]["Data"]["MergedDir"]
        subprocess.run(["umount", "-l", merged], check=False)  # gone already on a busy host
        result = run(client, held["id"], 'pwd; echo "$FOO"; id -u')
        assert (result["exit_code"], result["stdout"]) == (0, "/testbed\nbar\n1000\n"), result
        files_route = f"/leases/{held['id']}/files"
        assert client.put(files_route, params={"path": "rel.txt"}, content=b"x").status_code == 204
        assert run(client, held["id"], "stat -c %u /testbed/rel.txt")["stdout"] == "1000\n"
        assert client.get(files_route, params={"path": "/testbed/rel.txt"}).content == b"x"
        assert client.delete(f"/leases/{held['id']}").status_code == 204
    engine.close()


def test_a_file_command_that_cannot_run_is_an_infra_error() -> None:
    """Exit 126/127 from the engine (the user lookup, a missing sh) is the sandbox's failure: 502,
    retried by the worker; the path's own failures stay 400 and 404."""
    with pytest.raises(PlatformError) as cannot:
        dockerfiles._checked(126, "unable to find user root: no matching entries in passwd file", "f", "regular file")
    assert cannot.value.code is ErrorCode.TRANSPORT_ERROR and cannot.value.code.infra
    with pytest.raises(PlatformError) as killed:  # SIGKILL, not the path's failure
        dockerfiles._checked(137, "", "/tmp/rollout-grader/rollout_pytest_report.py", "regular file")
    assert killed.value.code is ErrorCode.TRANSPORT_ERROR
    with pytest.raises(PlatformError) as missing:
        dockerfiles._checked(dockerfiles.MISSING, "", "f", "regular file")
    assert missing.value.code is ErrorCode.NOT_FOUND
    with pytest.raises(PlatformError) as refused:
        dockerfiles._checked(1, "mkdir: can't create directory", "f", "regular file")
    assert refused.value.code is ErrorCode.BAD_REQUEST


class _Echo(http.server.BaseHTTPRequestHandler):
    """The stand-in proxy: answers every request with the path it was sent."""

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# run inside the container behind the relay on 127.0.0.1:8399 (the host's python3: a host_usr template)
GATEWAY_PROBE = """
import json, os, urllib.error, urllib.request
def get(path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:8399" + path, timeout=30) as r:
            return r.status, json.load(r)["path"]
    except urllib.error.HTTPError as e:
        return e.code, ""
try:
    open("/opt/agents/x", "w")
    wrote = "wrote"
except OSError as e:
    wrote = type(e).__name__
print(json.dumps({"own": get("/e/sess-docker-1/v1/models"), "other": get("/e/sess-other-1/v1/models"),
                  "admin": get("/admin/pools"), "run": sorted(os.listdir("/run/rollout")), "wrote": wrote,
                  "bundle": open("/opt/agents/hello/bundle.json").read()}))
"""


def test_a_docker_sandbox_reaches_its_own_gateway_session_and_the_bundles(
    dockerd: Dockerd, start_broker: BrokerFactory, state_dir: Path, upstream: str
) -> None:
    """The lease's gateway socket is bind-mounted at /run/rollout and relays only its session; the
    command behind ``gateway_port`` reaches it at 127.0.0.1 in the container (network "none"); the
    bundles are at /opt/agents, read-only; an image without python3 gets a clear exit 127."""
    agents = Path(tempfile.mkdtemp(prefix="rollout-agents-"))
    (agents / "hello").mkdir(parents=True)
    (agents / "hello" / "bundle.json").write_text("hello-bundle")
    agents.chmod(0o755)
    broker = start_broker("--backend", "docker", env=docker_env(dockerd, ROLLOUT_BROKER_AGENTS_DIR=str(agents)))
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        isolation = client.get("/healthz").json()["isolation"]
        assert (isolation["host_paths"], isolation["agent_bundles"]) == (True, True)
        assert str(agents) not in str(isolation)  # no host path on /healthz
        made = client.post("/templates", json={"name": "hostpy", "image": IMAGE, "host_usr": True})
        assert made.status_code == 201, made.text
        held = lease(client, job="dj", template="hostpy")
        binding = {"session": "sess-docker-1", "upstream": upstream, "ttl_s": 60}
        assert client.post(f"/leases/{held['id']}/gateway", json=binding).status_code == 204
        probe = {"argv": ["python3", "-c", GATEWAY_PROBE], "gateway_port": 8399}
        result = client.post(f"/leases/{held['id']}/exec", json=probe).json()
        assert result["exit_code"] == 0, result
        report = json.loads(result["stdout"])
        assert report["own"] == [200, "/e/sess-docker-1/v1/models"], report
        assert (report["other"][0], report["admin"][0]) == (403, 403), report
        assert report["run"] == ["gateway.sock"] and report["wrote"] in ("OSError", "PermissionError"), report
        assert report["bundle"] == "hello-bundle", report

        plain = lease(client, job="dj")  # busybox, no python3: the relay cannot start
        body = {"argv": ["true"], "gateway_port": 8399}
        answer = client.post(f"/leases/{plain['id']}/exec", json=body)
        assert answer.status_code == 200, answer.text
        refused = answer.json()
        assert refused["exit_code"] == 127 and "needs python3" in refused["stderr"], refused
        for item in (held, plain):
            assert client.delete(f"/leases/{item['id']}").status_code == 204
    assert list((state_dir / GATEWAY_ROOT).iterdir()) == []  # each container's directory went with it
    broker.stop()
    (agents / "hello" / "bundle.json").unlink()
    (agents / "hello").rmdir()
    agents.rmdir()

"""``command`` agents inside docker sandboxes, end to end on a private dockerd (skipped where it
cannot start): Redis, a scripted engine, the proxy with the gateway and ``REQUIRE_TOKEN``, the broker
on the docker backend, the API and a worker. The task image is busybox with an unprivileged
``USER 1000`` and a ``host_usr`` template (the host's /usr read-only: python3 for the gateway relay
and for the bundles' venvs); every container is ``network: "none"``, the lease's gateway socket
bind-mounted at /run/rollout and the bundles at /opt/agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import httpx
import orjson
import pytest
import redis

from services.benchmarks.bundled_harnesses import MINI, QUIET
from services.protocol import Status, Trajectory, keys
from services.runtime.chat import ChatTemplate
from services.sandbox_broker.bundles import installed
from tests.rollout_api.bundled import FAILED, bundles_dir, hermes
from tests.rollout_api.fleet import (
    ADMIN,
    SECRETS,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    submit,
    task,
    trajectories,
    wait_finished,
    wait_for,
)
from tests.rollout_api.test_sandbox_agents import PROBE
from tests.sandbox_broker.dockerd import Dockerd, import_image, private_dockerd

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(900)]

AGENT_IMAGE = "rollout/agent-box:test"
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n"
RULES: dict[str, list[Any]] = {
    "MSWEA-DOCKER": [
        "I will write the answer.\n" + hermes("bash", {"command": "echo 42 > answer.txt"}),
        hermes("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
}


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    with private_dockerd() as daemon:
        if isinstance(daemon, str):
            pytest.skip(daemon)
        yield daemon


AGENTS_DIRS: list[Path] = []  # the broker's agents_dir, set by the fleet


def _bundles() -> Path:
    """The real bundles (mini-swe-agent built into the cache when missing; where it cannot be built
    its test skips with the reason, the attack test needs none)."""
    AGENTS_DIRS[:] = [bundles_dir(("mini-swe-agent",))]
    return AGENTS_DIRS[0]


@pytest.fixture(scope="module")
def fleet(dockerd: Dockerd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    engine = docker.DockerClient(base_url=dockerd.url)
    files = {"etc/passwd": (PASSWD, 0), "home": (None, 0), "home/agent": (None, 1000)}
    import_image(engine, AGENT_IMAGE, files, ["USER 1000:1000", "WORKDIR /home/agent", "ENV HOME=/home/agent"])
    engine.close()
    env = {"ROLLOUT_BROKER_DOCKER_HOST": dockerd.url, "ROLLOUT_BROKER_DOCKER_IMAGE": AGENT_IMAGE,
           "ROLLOUT_BROKER_DOCKER_EXEC_ROOT": dockerd.exec_root,
           "ROLLOUT_BROKER_AGENTS_DIR": str(_bundles())}  # fmt: skip
    with running_fleet(tmp_path_factory.mktemp("dkfleet"), RULES, "dk", broker_env=env, backend="docker") as fleet:
        template = {"name": "agentbox", "image": AGENT_IMAGE, "host_usr": True}
        made = httpx.post(f"{fleet.broker.url}/templates", json=template, headers=bearer(ADMIN), timeout=60)
        assert made.status_code == 201, made.text
        fleet.start_worker(jobs=["dockagents", "victim"], concurrency=4)
        yield fleet


_HEADERS: dict[str, str] = {}


def run_one(fleet: Fleet, task_id: str, agent: dict[str, Any], files: dict[str, str] | None = None) -> Trajectory:
    with fleet.client() as client:
        if not _HEADERS:
            _HEADERS.update(create_job(client, "dockagents"))
        sandbox = {"template": "agentbox", "files": files or {}}
        body = {"job": "dockagents", "group_size": 1, "agent": agent, "max_attempts": 1,
                "limits": {"wall_clock_s": 300},
                "tasks": [task(task_id, f"{task_id}: answer 42", sandbox=sandbox)]}  # fmt: skip
        rollout = submit(client, _HEADERS, body)
        wait_finished(client, _HEADERS, rollout, timeout_s=400)
    (traj,) = [t for t in trajectories(fleet.redis_url, "dockagents") if t.task_id == task_id]
    return traj


def _text(response: httpx.Response) -> str:
    return response.text.strip() if response.status_code == 200 else ""


def test_an_attacking_agent_in_a_docker_sandbox_reaches_nothing_of_the_platform_or_another_job(fleet: Fleet) -> None:
    """The attack of ``test_sandbox_agents`` (whose docstring tells what it found on the old code,
    agents beside the worker) on the docker backend: job A's agent, in its container with job B's
    agent running in another and B's lease and session ids handed to it, reads no token, key or
    password of any other process; the host's Redis, broker, proxy, API and engine ports and any
    other address are unreachable; through its gateway only its own session answers."""
    broker = httpx.Client(base_url=fleet.broker.url, headers=bearer(SECRETS.service_token), timeout=30)
    with fleet.client() as client:
        victim = create_job(client, "victim")
        script = "echo $OPENAI_API_KEY > key.txt; echo 42 > answer.txt; exec sleep 600"
        body = {"job": "victim", "group_size": 1, "agent": {"kind": "command", "argv": ["/bin/sh", "-c", script]},
                "tasks": [task("VICTIM", "VICTIM: wait", sandbox={"template": "agentbox"})]}  # fmt: skip
        b_rollout = submit(client, victim, body)
        try:
            leases = wait_for("B's lease", lambda: [x["id"] for x in broker.get("/leases?job=victim").json()], 300)
            b_lease, read = leases[0], {"path": "key.txt"}
            b_key = wait_for("B's key", lambda: _text(broker.get(f"/leases/{b_lease}/files", params=read)), 300)
            with redis.Redis.from_url(fleet.redis_url) as store:
                (b_session,) = (k.decode().split("{")[1].split("}")[0] for k in store.keys(keys.gateway_session("*")))
            ports = {"redis": urlsplit(fleet.redis_url).port, "broker": urlsplit(fleet.broker.url).port,
                     "proxy": urlsplit(fleet.proxy.url).port, "api": urlsplit(fleet.api.url).port,
                     "engine": urlsplit(fleet.engines["default"].url).port}  # fmt: skip
            env = {"PROBE_PORTS": ",".join(f"{k}={v}" for k, v in ports.items()), "PROBE_LEASE": b_lease,
                   "PROBE_SESSION": b_session, "PROBE_HOSTS": "10.0.2.2:80,1.1.1.1:443"}  # fmt: skip
            agent = {"kind": "command", "argv": ["python3", "probe.py"], "env": env, "output_max_bytes": 200_000}
            traj = run_one(fleet, "ATTACK", agent, files={"probe.py": PROBE})
        finally:
            client.delete(f"/rollouts/{b_rollout}", headers=victim)
            broker.close()
    assert traj.agent is not None and traj.agent.exit_code == 0, (traj.infra, traj.agent)
    line = next(x for x in traj.agent.last_output.splitlines() if x.startswith("PROBE "))
    report = json.loads(line[6:])
    seen = json.dumps(report)
    for secret in (SECRETS.admin_token, SECRETS.service_token, b_key, fleet.redis_url):
        assert secret not in seen, f"the agent read {secret!r}"
    assert report["uid"] == 1000
    assert all(v in ("ConnectionRefusedError", "OSError", "TimeoutError") for v in report["tcp"].values()), report
    assert report["tcp"].keys() == {*ports, "10.0.2.2:80", "1.1.1.1:443"}
    own = report["gateway"].pop("own models")
    assert own == 200, report  # its own session answers: the refusals below are the forwarder's
    assert set(report["gateway"].values()) == {403} and set(report["sockets"].values()) == {403}, report
    assert report["files"]["/etc/shadow"] == "FileNotFoundError" and report["files"]["/run/rollout"] == ["gateway.sock"]


def test_mini_swe_agent_from_its_bundle_finishes_in_a_docker_sandbox_token_exact(fleet: Fleet) -> None:
    """The real mini-swe-agent (its default tool-calling ``mini.yaml``), from the bundle mounted at
    /opt/agents, runs inside the container and reaches the gateway through the socket forwarder."""
    found = {b.name: b for b in installed(AGENTS_DIRS[0])}
    if "mini-swe-agent" not in found:
        pytest.skip(FAILED.get("mini-swe-agent", f"no mini-swe-agent bundle in {AGENTS_DIRS[0]}"))
    agent = {"kind": "command", "bundle": "mini-swe-agent", "argv": ["/bin/sh", "-c", MINI], "env": QUIET}
    traj = run_one(fleet, "MSWEA-DOCKER", agent)
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, (traj.infra, traj.agent)
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    bundle = found["mini-swe-agent"]
    assert (traj.agent.bundle, traj.agent.bundle_version, traj.agent.bundle_digest) == (
        "mini-swe-agent", bundle.version, bundle.digest)  # fmt: skip
    assert traj.agent.calls == 2 and traj.agent.retokenization_mismatches == 0 and traj.segments == []
    with redis.Redis.from_url(fleet.redis_url) as store:
        context = orjson.loads(store.get(keys.gateway_context(traj.agent.session)))
    chat = ChatTemplate.from_dir(fleet.model_path)
    rendered = chat.encode(chat.render([*context["messages"], context["reply"]], False, context["tools"]))
    held = [*traj.prompt_ids, *traj.response_ids]
    assert rendered[: len(held)] == held and rendered[len(held) :] == chat.encode("\n")
    generated = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert len(generated) == sum(t.response_tokens for t in traj.turns)
    assert chat.decode(generated).count("<tool_call>") == 2


# a paired agent with the standard library only: exec in the task's container through its own forwarder
PAIRED = """
import json, os, urllib.error, urllib.request
env = os.environ
base, token, lease = env["ROLLOUT_BROKER_URL"], env["ROLLOUT_BROKER_TOKEN"], env["ROLLOUT_LEASE_ID"]
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, data, headers, method=method), timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None
code, done = call("POST", f"/leases/{lease}/exec", {"shell": "echo 42 > answer.txt; id -u; ls"})
print("there:", json.dumps([code, done["stdout"].split() if done else None]))
print("here:", json.dumps(sorted(os.listdir("."))))
print("list leases:", call("GET", "/leases")[0])
"""


def test_a_paired_agent_in_a_docker_sandbox_drives_the_task_container_through_its_forwarder(fleet: Fleet) -> None:
    """``where: "paired"`` on docker: the agent's own container reaches exec of the task's lease (and
    nothing else of the broker) at 127.0.0.1 through its gateway socket; the task's files are not in it."""
    agent = {"kind": "command", "where": "paired", "agent_template": "agentbox", "argv": ["python3", "-c", PAIRED]}
    traj = run_one(fleet, "PAIRED-DOCKER", agent, files={"task_note.txt": "the task's"})
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, (traj.infra, traj.agent)
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    lines = dict(line.split(": ", 1) for line in traj.agent.last_output.splitlines() if ": " in line)
    code, there = json.loads(lines["there"])
    assert code == 200 and there[0] == "1000" and "task_note.txt" in there, lines
    assert "task_note.txt" not in json.loads(lines["here"]) and lines["list leases"] == "403", lines

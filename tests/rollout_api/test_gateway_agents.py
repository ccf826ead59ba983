"""Gateway agents end to end with real processes (Redis, scripted engine, proxy, broker with local
sandboxes, API, worker): the built-in ``tools`` agent with the Hermes parser, the real
mini-swe-agent from PyPI, unmodified, as a ``command`` agent on the host, and the host mode's
confinement and refusals (the refusals' test creates a second job, so it runs last)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import minisweagent
import orjson
import pytest
import redis
import redis.asyncio as aioredis

from agent_client.sandbox import SandboxClient
from services.protocol import Status, Trajectory, keys
from services.rollout_api.settings import WorkerSettings
from services.rollout_api.worker.host_agent import confined
from services.runtime.auth import mint_lease_token, revoke_lease_token
from services.runtime.chat import ChatTemplate
from tests.rollout_api.fleet import (
    SECRETS,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    submit,
    task,
    trajectories,
    wait_finished,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]  # fleet start + litellm import under load


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


RULES: dict[str, list[Any]] = {
    "TOOLS-TASK": [
        "<tool_call>\n{not json}\n</tool_call>",  # malformed: fed back as an error, counted
        "Writing it.\n" + hermes("file", {"command": "create", "path": "answer.txt", "file_text": "42"}),
        hermes("submit", {}),
    ],
    "OPENAI-TASK": [
        "I will write the answer.\n" + hermes("bash", {"command": "echo 42 > answer.txt"}),
        "answer.txt holds 42.",
    ],
    "MSWEA-TASK": [
        "I will write the answer.\n" + hermes("bash", {"command": "echo 42 > answer.txt"}),
        hermes("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, ChatTemplate]]:
    allow = {"ROLLOUT_API_ALLOW_HOST_AGENTS": "true"}  # these agents run on the worker's host (its venv)
    with running_fleet(tmp_path_factory.mktemp("gwfleet"), RULES, "gw", api_env=allow) as fleet:
        fleet.start_worker(jobs=["agents"], concurrency=4, **HOST_ON)
        yield fleet, ChatTemplate.from_dir(fleet.model_path)


HOST_ON = {"ROLLOUT_WORKER_ALLOW_HOST_AGENTS": "true"}
AGENT_UID = WorkerSettings.model_fields["host_agent_uid"].default  # host agents run as it (a root worker)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the host agent's uid can read (pytest's own tmp_path is private to this uid)."""
    path = Path(tempfile.mkdtemp(prefix="host-agent-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def needs_venv_readable_by_agent() -> None:
    """Host agents run as ``AGENT_UID`` under a root worker: skip where it cannot run this checkout's venv."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    check = confined(bwrap, AGENT_UID if os.geteuid() == 0 else None, "/tmp", [sys.executable, "-c", IMPORTS])
    env = {"PYTHONPATH": str(ROOT), "HOME": "/tmp"}
    done = subprocess.run(check, env=env, cwd="/", capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"uid {AGENT_UID} (host agents) cannot run {sys.executable} with {ROOT}: {done.stderr[-200:]!r}")


IMPORTS = "import minisweagent, openai, agent_client"


def run_one(fleet: Fleet, task_id: str, agent: dict[str, Any]) -> Trajectory:
    with fleet.client() as client:
        headers = _job(client)
        body = {"job": "agents", "group_size": 1, "agent": agent, "tasks": [task(task_id, f"{task_id}: answer 42")]}
        rollout = submit(client, headers, body)
        wait_finished(client, headers, rollout, timeout_s=180)
    (traj,) = [t for t in trajectories(fleet.redis_url, "agents") if t.task_id == task_id]
    return traj


_HEADERS: dict[str, str] = {}  # the job's bearer header, created by the first test that runs


def _job(client: Any) -> dict[str, str]:
    if not _HEADERS:
        _HEADERS.update(create_job(client, "agents"))
    return _HEADERS


def test_tools_agent_with_hermes_parser_survives_a_malformed_call(fleet: tuple[Fleet, ChatTemplate]) -> None:
    traj = run_one(fleet[0], "TOOLS-TASK", {"kind": "tools", "parser": "hermes"})
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.kind == "tools"
    assert traj.agent.format_errors == 1 and traj.agent.calls == 3
    assert traj.segments == [] and len(traj.turns) == 3
    generated = sum(t.response_tokens for t in traj.turns)
    assert sum(traj.loss_mask) == generated
    for turn in traj.turns:  # every turn's generated tokens sit at its offset, under mask 1
        span = traj.loss_mask[turn.response_offset : turn.response_offset + turn.response_tokens]
        assert all(span) and len(span) == turn.response_tokens


def test_mini_swe_agent_unmodified_as_a_command_agent(fleet: tuple[Fleet, ChatTemplate]) -> None:
    needs_venv_readable_by_agent()
    config = Path(minisweagent.__file__).parent / "config" / "mini.yaml"
    argv = [sys.executable, "-m", "agent_client.mini_swe_agent", str(config)]
    traj = run_one(fleet[0], "MSWEA-TASK", {"kind": "command", "argv": argv, "where": "host"})
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert_token_exact(fleet, traj, calls=2, tool_calls=2)


def test_the_openai_sdk_example_of_the_docs_as_a_command_agent(
    fleet: tuple[Fleet, ChatTemplate], shared_dir: Path
) -> None:
    text = (ROOT / "docs" / "agents.md").read_text()
    example = re.search(r"### Worked example: the openai SDK\n+```python\n(.*?)```", text, re.S)
    assert example is not None, "docs/agents.md lost its openai SDK example"
    needs_venv_readable_by_agent()
    (shared_dir / "my_agent.py").write_text(example.group(1))
    traj = run_one(
        fleet[0], "OPENAI-TASK", {"kind": "command", "argv": [sys.executable, str(shared_dir / "my_agent.py")],
                                  "where": "host"},
    )  # fmt: skip
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert_token_exact(fleet, traj, calls=2, tool_calls=1)  # the last reply has no call: the example stops


def test_a_host_agent_reads_no_other_process_environ(fleet: tuple[Fleet, ChatTemplate], shared_dir: Path) -> None:
    """``test_sandbox_agents``' attacker, run where host agents run: before the confinement it read the
    worker's service token in ``/proc/*/environ`` (the old code: a plain child of the worker, as its
    uid). Now its ``/proc`` holds only its own pid namespace, its uid is the dedicated one (under a
    root worker) and root's files are closed; it still shares the host's network (documented)."""
    probe = shared_dir / "agent_probe.py"
    shutil.copy(Path(__file__).parent / "agent_probe.py", probe)
    probe.chmod(0o644)
    ports = {"broker": urlsplit(fleet[0].broker.url).port, "redis": urlsplit(fleet[0].redis_url).port}
    env = {"PROBE_PORTS": ",".join(f"{k}={v}" for k, v in ports.items())}
    agent = {"kind": "command", "argv": ["/usr/bin/python3", str(probe)], "where": "host", "env": env,
             "output_max_bytes": 1_000_000}  # fmt: skip
    traj = run_one(fleet[0], "PROBE-HOST", agent)
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    line = next(x for x in traj.agent.last_output.splitlines() if x.startswith("PROBE "))
    report = json.loads(line[6:])
    environ = json.dumps(report["environ"])
    for secret in (SECRETS.service_token, SECRETS.admin_token, "ROLLOUT_SERVICE_TOKEN", "ROLLOUT_REDIS_URL"):
        assert secret not in environ, (secret, report["environ"])
    assert len(report["environ"]) <= 2, report["environ"]  # its sandbox's init (and its own children), nothing else
    if os.geteuid() == 0:
        assert report["uid"] == AGENT_UID and report["files"]["/etc/shadow"] == "PermissionError", report
    assert report["tcp"]["broker"] == "connected", report["tcp"]  # the host's network, as documented


def assert_token_exact(fleet: tuple[Fleet, ChatTemplate], traj: Trajectory, *, calls: int, tool_calls: int) -> None:
    """One segment whose ids are the chat template rendered over the conversation the agent sent,
    mask 1 on exactly the generated tokens; the agent's broker token is gone with the episode."""
    assert traj.agent is not None and traj.agent.calls == calls, traj.agent
    assert traj.agent.retokenization_mismatches == 0 and traj.segments == []
    client = redis.Redis.from_url(fleet[0].redis_url)
    try:
        context = orjson.loads(client.get(keys.gateway_context(traj.agent.session)))  # type: ignore[arg-type]
        assert client.keys(keys.lease_token("*")) == []
    finally:
        client.close()
    chat = fleet[1]
    conversation = [*context["messages"], context["reply"]]
    rendered = chat.encode(chat.render(conversation, False, context["tools"]))
    held = [*traj.prompt_ids, *traj.response_ids]
    assert rendered[: len(held)] == held and rendered[len(held) :] == chat.encode("\n")
    generated = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert len(generated) == sum(t.response_tokens for t in traj.turns)
    assert chat.decode(generated).count("<tool_call>") == tool_calls


def test_a_lease_token_reaches_exec_and_files_of_its_own_lease_only(fleet: tuple[Fleet, ChatTemplate]) -> None:
    broker = fleet[0].broker.url
    service = httpx.Client(base_url=broker, headers=bearer(SECRETS.service_token), timeout=60)
    own, other = (service.post("/leases", json={"job": "agents", "ttl_s": 120}).json()["id"] for _ in range(2))
    token = asyncio.run(_mint(fleet[0].redis_url, own))
    box = SandboxClient(broker, own, token=token)
    agent = httpx.Client(base_url=broker, headers=bearer(token), timeout=60)
    try:
        box.write_file("note.txt", "mine")
        assert box.exec("cat note.txt").stdout == "mine" and box.read_file("note.txt") == b"mine"
        refused = {
            ("POST", f"/leases/{other}/exec", 404), ("POST", f"/leases/{other}/exec/stream", 404),
            ("GET", f"/leases/{other}/files?path=/etc/hostname", 404), ("PUT", f"/leases/{other}/files?path=x", 404),
            ("GET", f"/leases/{other}/archive?path=/workspace", 404), ("GET", "/leases", 401),
            ("GET", f"/leases/{own}", 401), ("POST", f"/leases/{own}/renew", 401), ("DELETE", f"/leases/{own}", 401),
            ("POST", "/leases", 401), ("GET", "/templates", 401),
        }  # fmt: skip
        for method, path, status in refused:
            response = agent.request(method, path, json={"shell": "id", "ttl_s": 60, "job": "agents"})
            code = {404: "lease_not_found", 401: "unauthorized"}[status]
            assert (response.status_code, response.json()["error"]["code"]) == (status, code), (method, path)
        asyncio.run(_revoke(fleet[0].redis_url, token))
        assert agent.post(f"/leases/{own}/exec", json={"shell": "id"}).status_code == 401
    finally:
        for lease in (own, other):
            service.delete(f"/leases/{lease}")
        box.close()
        agent.close()
        service.close()


async def _mint(redis_url: str, lease: str) -> str:
    async with aioredis.Redis.from_url(redis_url) as client:
        return await mint_lease_token(client, lease, 120)


async def _revoke(redis_url: str, token: str) -> None:
    async with aioredis.Redis.from_url(redis_url) as client:
        await revoke_lease_token(client, token)


def test_host_agents_are_refused_while_several_jobs_exist(fleet: tuple[Fleet, ChatTemplate]) -> None:
    """Last in this module (it creates a second job). With no worker on the job: an item accepted while
    one job exists is refused by a worker without the setting (an infra error naming it); a second
    job is created; the API answers 409 ``conflict`` on ``agent.where``; an item accepted before is
    refused by a worker with the setting (infra error ``conflict``). None of them ran."""
    flt = fleet[0]
    for worker in flt.workers:
        worker.stop()
    agent = {"kind": "command", "argv": ["/bin/true"], "where": "host"}
    with flt.client() as client:
        headers = _job(client)

        def host_rollout(task_id: str) -> str:
            body = {"job": "agents", "group_size": 1, "max_attempts": 1, "agent": agent, "tasks": [task(task_id, "x")]}
            return submit(client, headers, body)

        strict = flt.start_worker(jobs=["agents"], concurrency=1)
        wait_finished(client, headers, host_rollout("STRICT"), timeout_s=60)
        strict.stop()
        queued = host_rollout("QUEUED")
        create_job(client, "second")
        body = {"job": "agents", "group_size": 1, "agent": agent, "tasks": [task("REFUSED", "x")]}
        refused = client.post("/rollouts", json=body, headers=headers)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["field"]) == ("conflict", "agent.where"), error
        flt.start_worker(jobs=["agents"], concurrency=1, **HOST_ON)
        wait_finished(client, headers, queued, timeout_s=60)
    found = {t.task_id: t for t in trajectories(flt.redis_url, "agents")}
    assert "REFUSED" not in found
    for task_id, code, says in (
        ("STRICT", "forbidden", "ROLLOUT_WORKER_ALLOW_HOST_AGENTS"),
        ("QUEUED", "conflict", "2 jobs"),
    ):
        traj = found[task_id]
        assert traj.status is Status.INFRA_ERROR and traj.infra is not None, traj
        assert traj.infra.code == code and says in traj.infra.message, traj.infra
        assert traj.agent is None or traj.agent.exit_code is None, traj.agent

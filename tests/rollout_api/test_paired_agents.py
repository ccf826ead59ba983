"""``where: "paired"`` end to end with real processes (Redis, scripted engine, proxy with the gateway,
broker with local sandboxes, API, worker): the agent runs in a sandbox of its own, from a bundle, and
drives the task sandbox with ``agent_client.sandbox.SandboxClient`` through its lease's forwarder."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.protocol import Status, keys
from services.sandbox_broker.bundles import publish, wrapper
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

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_PYTHON = "/usr/bin/python3"  # what a local sandbox of the default template runs
# agent_client and what it imports, copied from this venv (pure Python but pydantic_core and msgspec,
# whose extension modules need the same Python minor version as the sandbox's)
PACKAGES = ("httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi", "pydantic", "pydantic_core",
            "typing_extensions", "annotated_types", "typing_inspection", "msgspec")  # fmt: skip


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


RULES: dict[str, list[Any]] = {
    "PAIRED": [
        "I will write the answer.\n" + hermes("bash", {"command": "echo 42 > answer.txt && id -u && ls"}),
        "answer.txt holds 42.",
    ],
}

# the docs' openai SDK example over urllib, its bash run in the task sandbox through agent_client
AGENT = """
import json, os, urllib.request
from agent_client.sandbox import SandboxClient

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["OPENAI_MODEL"]
box = SandboxClient.from_env()
bash = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
        "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def chat(messages):
    body = json.dumps({"model": model, "messages": messages, "tools": [bash]}).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    request = urllib.request.Request(base + "/chat/completions", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.load(answer)["choices"][0]["message"]


messages = [{"role": "user", "content": os.environ["ROLLOUT_TASK"]}]
for _ in range(20):
    message = chat(messages)
    messages.append({k: v for k, v in message.items() if v is not None})
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        done = box.exec(json.loads(call["function"]["arguments"])["command"])
        print("task sandbox:", done.stdout.split())
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
print("here:", json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "files": sorted(os.listdir(".")),
                           "task file": os.path.exists("/workspace/task_note.txt")}))
print("there:", box.read_file("task_note.txt"))
other = box.http.get(f"{os.environ['ROLLOUT_BROKER_URL']}/leases")
print("list leases:", other.status_code)
"""


def agent_client_bundle(tree: Path) -> str:
    """agent_client, the contract and their packages under lib/, the agent under bin/."""
    lib = tree / "lib"
    for name in PACKAGES:
        source = Path(importlib.import_module(name).__file__ or "")
        if source.name == "__init__.py":
            shutil.copytree(source.parent, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, lib / source.name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "agent_client", lib / "agent_client", ignore=ignore)
    shutil.copytree(ROOT / "services" / "protocol", lib / "services" / "protocol", ignore=ignore)
    shutil.copy(ROOT / "services" / "__init__.py", lib / "services" / "__init__.py")
    (tree / "agent.py").write_text(AGENT)
    inside = "/opt/agents/agent-client"
    wrapper(tree / "bin" / "paired-agent", f"/usr/bin/env PYTHONPATH={inside}/lib {SANDBOX_PYTHON} {inside}/agent.py")
    return "1.0"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    agents = Path(tempfile.mkdtemp(prefix="rollout-agents-"))
    agents.chmod(0o755)  # bound into sandboxes as their user: pytest's tmp root (0700) is out of its reach
    publish(agents, "agent-client", "local:test", ["paired-agent"], agent_client_bundle)
    check = [SANDBOX_PYTHON, "-c", "import agent_client.sandbox"]
    env = {"PYTHONPATH": str(agents / "agent-client" / "lib")}
    if subprocess.run(check, env=env, cwd="/", capture_output=True, check=False).returncode != 0:
        shutil.rmtree(agents)
        pytest.skip(f"{SANDBOX_PYTHON} cannot import this venv's packages (Python {sys.version_info[:2]})")
    with running_fleet(tmp_path_factory.mktemp("pairedfleet"), RULES, "pa",
                       broker_env={"ROLLOUT_BROKER_AGENTS_DIR": str(agents)}) as fleet:  # fmt: skip
        fleet.start_worker(jobs=["paired"], concurrency=2)
        yield fleet
    shutil.rmtree(agents)


def test_a_paired_agent_drives_the_task_sandbox_from_its_own(fleet: Fleet) -> None:
    """Its commands ran in the task sandbox (the reward sees answer.txt there), its own filesystem
    holds none of the task's files, its lease token reached exec and files of the task's lease and
    nothing else; its sandbox is released and its token revoked with the episode."""
    agent = {"kind": "command", "where": "paired", "bundle": "agent-client", "argv": ["paired-agent"]}
    with fleet.client() as client:
        headers = create_job(client, "paired")
        files = {"task_note.txt": "the task's"}
        body = {"job": "paired", "group_size": 1, "agent": agent,
                "tasks": [task("PAIRED", "PAIRED: answer 42", sandbox={"files": files})]}  # fmt: skip
        wait_finished(client, headers, submit(client, headers, body), timeout_s=180)
    (traj,) = trajectories(fleet.redis_url, "paired")
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert traj.agent.bundle == "agent-client" and traj.agent.calls == 2, traj.agent
    out = traj.agent.last_output
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line}
    assert "'1000'" in lines["task sandbox"] and "'task_note.txt'" in lines["task sandbox"], out  # ls, id there
    here = json.loads(lines["here"])
    assert here["task file"] is False and "task_note.txt" not in here["files"] and "answer.txt" not in here["files"]
    assert lines["there"] == 'b"the task\'s"' and lines["list leases"] == "403", out  # the forwarder
    broker = httpx.Client(base_url=fleet.broker.url, headers=bearer(SECRETS.service_token), timeout=30)
    store = redis.Redis.from_url(fleet.redis_url)
    try:
        assert broker.get("/leases", params={"job": "paired"}).json() == []  # both sandboxes released
        assert store.keys(keys.lease_token("*")) == []
    finally:
        broker.close()
        store.close()


def test_an_unknown_agent_template_is_refused_at_submission(fleet: Fleet) -> None:
    agent = {"kind": "command", "where": "paired", "argv": ["x"], "agent_template": "no-such-template"}
    with fleet.client() as client:
        headers = create_job(client, "unknown-template")
        body = {"job": "unknown-template", "group_size": 1, "tasks": [task("T", "x", agent=agent)]}
        response = client.post("/rollouts", json=body, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("unknown_template", "tasks.0.agent.agent_template"), error

"""``command`` agents inside the task sandbox (the default ``where``), end to end with real processes
(Redis, scripted engine, proxy with the gateway, broker with local sandboxes, API, worker), with
host agents off as an operator leaves them."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import redis

from services.protocol import Status, Trajectory, keys
from services.runtime.chat import ChatTemplate
from services.sandbox_broker.bundles import installed, publish, wrapper
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
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]  # bounds for a loaded machine


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


RULES: dict[str, list[Any]] = {
    "LLM-INSIDE": [
        "I will write the answer.\n" + hermes("bash", {"command": "echo 42 > answer.txt && id -u"}),
        "answer.txt holds 42.",
    ],
}

# The openai SDK example of docs/agents.md with the standard library only (the sandbox sees the host's
# /usr, not a virtualenv), its bash run where it is: in the task sandbox.
AGENT = """
import json, os, subprocess, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["OPENAI_MODEL"]
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
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
print("base", base)
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    agents = Path(tempfile.mkdtemp(prefix="rollout-agents-"))
    agents.chmod(0o755)  # bubblewrap binds it as the sandbox user: pytest's tmp root (0700) is out of its reach
    publish(agents, "hello", "local:test", ["hello"], hello_bundle)
    AGENTS_DIRS[:] = [agents]
    env = {"ROLLOUT_BROKER_AGENTS_DIR": str(agents)}
    with running_fleet(tmp_path_factory.mktemp("sbfleet"), RULES, "sb", broker_env=env) as fleet:
        fleet.start_worker(jobs=["inside", "victim"], concurrency=4)
        yield fleet
    shutil.rmtree(agents)


def hello_bundle(tree: Path) -> str:
    """A bundle whose one command answers the task where it runs."""
    wrapper(tree / "bin" / "hello", "/bin/sh -c 'echo 42 > answer.txt; echo hello from $0' /opt/agents/hello/bin")
    return "1.0"


_HEADERS: dict[str, str] = {}
AGENTS_DIRS: list[Path] = []  # the broker's agents_dir, set by the fleet


def _job(client: Any) -> dict[str, str]:
    if not _HEADERS:
        _HEADERS.update(create_job(client, "inside"))
    return _HEADERS


def run_one(fleet: Fleet, task_id: str, agent: dict[str, Any], files: dict[str, str] | None = None) -> Trajectory:
    with fleet.client() as client:
        headers = _job(client)
        body = {"job": "inside", "group_size": 1, "agent": agent,
                "tasks": [task(task_id, f"{task_id}: answer 42", sandbox={"files": files or {}})]}  # fmt: skip
        rollout = submit(client, headers, body)
        wait_finished(client, headers, rollout, timeout_s=300)
    (traj,) = [t for t in trajectories(fleet.redis_url, "inside") if t.task_id == task_id]
    return traj


def test_a_command_agent_runs_inside_the_task_sandbox_as_its_user(fleet: Fleet) -> None:
    """Its files are the task's (the reward sees answer.txt), it is the sandbox's uid in its own
    pid namespace, and its environment holds the gateway's variables and no broker credentials."""
    script = ("echo 42 > answer.txt; echo uid=$(id -u); env | sort; "
              "for p in /proc/[0-9]*; do echo proc: $(tr '\\0' ' ' < $p/cmdline); done")  # fmt: skip
    traj = run_one(fleet, "INSIDE", {"kind": "command", "argv": ["/bin/sh", "-c", script], "env": {"MINE": "1"}})
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    out = traj.agent.last_output
    assert "uid=1000" in out and "MINE=1" in out and "ROLLOUT_TASK=INSIDE: answer 42" in out, out
    assert "OPENAI_BASE_URL=" in out and "OPENAI_API_KEY=" in out, out
    assert "ROLLOUT_BROKER" not in out and "ROLLOUT_LEASE_ID" not in out and "ROLLOUT_REDIS" not in out, out
    procs = [line for line in out.splitlines() if line.startswith("proc:")]
    assert procs and any("/bin/sh -c" in p for p in procs), out
    assert not [p for p in procs if "services.cli" in p or "redis" in p], out  # no host process is visible


def test_the_output_tail_and_exit_status_are_recorded(fleet: Fleet) -> None:
    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; exit 3"
    traj = run_one(fleet, "TAIL", {"kind": "command", "argv": ["/bin/sh", "-c", script], "output_max_bytes": 300})
    assert traj.agent is not None and traj.agent.exit_code == 3, traj.agent
    assert traj.agent.last_output.endswith("line-2999\n") and len(traj.agent.last_output) <= 300


def test_a_host_agent_is_refused_at_submission_when_the_operator_did_not_allow_it(fleet: Fleet) -> None:
    with fleet.client() as client:
        headers = _job(client)
        for where in ("host", "beside"):
            agent = {"kind": "command", "argv": ["/bin/true"], "where": where}
            body = {"job": "inside", "group_size": 1, "tasks": [task("HOST", "x", agent=agent)]}
            response = client.post("/rollouts", json=body, headers=headers)
            assert response.status_code == 403, response.text
            error = response.json()["error"]
            assert (error["code"], error["field"]) == ("forbidden", "tasks.0.agent.where"), error


def test_an_agent_in_the_sandbox_finishes_through_the_forwarded_gateway_token_exact(fleet: Fleet) -> None:
    """Its calls reach its session through 127.0.0.1 in the sandbox (network "none"), its tool runs
    in the sandbox; the trajectory's ids are the chat template over the conversation it sent."""
    agent = {"kind": "command", "argv": ["/usr/bin/python3", "agent.py"]}
    traj = run_one(fleet, "LLM-INSIDE", agent, files={"agent.py": AGENT})
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert "base http://127.0.0.1:" in traj.agent.last_output, traj.agent.last_output
    assert traj.agent.calls == 2 and traj.agent.retokenization_mismatches == 0 and traj.segments == []
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        context = orjson.loads(client.get(keys.gateway_context(traj.agent.session)))  # type: ignore[arg-type]
    finally:
        client.close()
    chat = ChatTemplate.from_dir(fleet.model_path)
    rendered = chat.encode(chat.render([*context["messages"], context["reply"]], False, context["tools"]))
    held = [*traj.prompt_ids, *traj.response_ids]
    assert rendered[: len(held)] == held and rendered[len(held) :] == chat.encode("\n")
    generated = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert len(generated) == sum(t.response_tokens for t in traj.turns)
    assert chat.decode(generated).count("<tool_call>") == 1
    assert context["messages"][-1]["content"].strip() == "1000", context["messages"][-1]  # id -u ran in the sandbox


PROBE = (Path(__file__).parent / "agent_probe.py").read_text()


def _text(response: httpx.Response) -> str:
    return response.text.strip() if response.status_code == 200 else ""


def test_an_attacking_agent_reads_and_reaches_nothing_of_the_platform_or_another_job(fleet: Fleet) -> None:
    """Job A's agent tries what an attacker with a job token tried on the code before agents ran
    in the sandbox (the host mode, ``where: "host"``, now off unless an operator allows it): there
    the program ran as the worker's child on its host (as root where the worker was), read the
    worker's ``ROLLOUT_SERVICE_TOKEN`` and ``ROLLOUT_REDIS_URL`` (with the Redis password), the
    other services' ``ROLLOUT_ADMIN_TOKEN`` and job B's episode ``OPENAI_API_KEY`` and
    ``ROLLOUT_BROKER_TOKEN`` from ``/proc/*/environ``, then exec'd in B's lease (200), wrote a turn
    into B's session and listed every job's leases with the service token.

    Here, with B's agent running at the same time and its lease and session ids handed to A: A sees
    no token, key or password of any other process; Redis, the broker, the proxy, the API and the
    engines on the host's loopback, and any other address, are unreachable; through its gateway
    only its own session answers (B's session, the proxy's other routes, the broker's routes,
    ``..`` and encoded paths: 403). ``test_gateway_agents`` runs the same probe on the host to show
    that it finds what is there to find."""
    broker = httpx.Client(base_url=fleet.broker.url, headers=bearer(SECRETS.service_token), timeout=30)
    with fleet.client() as client:
        victim = create_job(client, "victim")
        script = "echo $OPENAI_API_KEY > key.txt; echo 42 > answer.txt; exec sleep 600"
        body = {"job": "victim", "group_size": 1, "agent": {"kind": "command", "argv": ["/bin/sh", "-c", script]},
                "tasks": [task("VICTIM", "VICTIM: wait")]}  # fmt: skip
        b_rollout = submit(client, victim, body)
        try:
            leases = wait_for("B's lease", lambda: [x["id"] for x in broker.get("/leases?job=victim").json()], 300)
            b_lease, read = leases[0], {"path": "/workspace/key.txt"}
            b_key = wait_for("B's key", lambda: _text(broker.get(f"/leases/{b_lease}/files", params=read)), 300)
            with redis.Redis.from_url(fleet.redis_url) as store:
                (b_session,) = (k.decode().split("{")[1].split("}")[0] for k in store.keys(keys.gateway_session("*")))
            ports = {"redis": urlsplit(fleet.redis_url).port, "broker": urlsplit(fleet.broker.url).port,
                     "proxy": urlsplit(fleet.proxy.url).port, "api": urlsplit(fleet.api.url).port,
                     "engine": urlsplit(fleet.engines["default"].url).port}  # fmt: skip
            env = {"PROBE_PORTS": ",".join(f"{k}={v}" for k, v in ports.items()), "PROBE_LEASE": b_lease,
                   "PROBE_SESSION": b_session, "PROBE_HOSTS": "10.0.2.2:80,1.1.1.1:443"}  # fmt: skip
            agent = {"kind": "command", "argv": ["/usr/bin/python3", "probe.py"], "env": env,
                     "output_max_bytes": 200_000}  # fmt: skip
            traj = run_one(fleet, "ATTACK", agent, files={"probe.py": PROBE})
        finally:
            client.delete(f"/rollouts/{b_rollout}", headers=victim)
            broker.close()
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
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


def test_an_agent_from_a_bundle_runs_by_its_command_name_and_is_recorded(fleet: Fleet) -> None:
    (bundle,) = installed(AGENTS_DIRS[0])
    traj = run_one(fleet, "BUNDLE", {"kind": "command", "bundle": "hello", "argv": ["hello"]})
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, traj.infra
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert traj.agent.last_output == "hello from /opt/agents/hello/bin\n"
    assert (traj.agent.bundle, traj.agent.bundle_version, traj.agent.bundle_digest) == ("hello", "1.0", bundle.digest)


def test_a_bundle_that_is_not_installed_ends_the_attempt_naming_it(fleet: Fleet) -> None:
    traj = run_one(fleet, "NOBUNDLE", {"kind": "command", "bundle": "nowhere", "argv": ["nowhere"]})
    assert traj.status is Status.INFRA_ERROR and traj.infra is not None, traj
    assert traj.infra.code == "bad_request" and "rollout agents install nowhere" in traj.infra.message, traj.infra
    assert traj.infra.attempts == 1

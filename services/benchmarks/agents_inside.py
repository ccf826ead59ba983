"""``rollout bench agents`` inside the task sandbox (``--where sandbox``, the default): a sandbox
broker on the local backend with the agent bundles bound at ``/opt/agents``; per episode a lease
(``network: "none"``), the task's files written there, the episode's gateway session bound to the
lease's forwarder (``POST /leases/{id}/gateway``, as the worker does), and the harness started from
its bundle through the broker's exec behind the relay on ``127.0.0.1:PORT``, with the environment
the worker gives a sandbox agent. Its tools act on the sandbox's files."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from services.benchmarks.bundled_harnesses import QUIET, Inside
from services.benchmarks.harnesses import MODEL, Harness, aider_test
from services.benchmarks.proxy_fleet import launch
from services.protocol.agents import AGENTS_DIR
from services.runtime.net import free_port
from services.runtime.secrets import FleetSecrets
from services.sandbox_broker.backends.leftovers import remove_state_dir

PORT = 8399  # the relay's port inside the sandbox (the worker's sandbox_gateway_port)
FILES = "printf 'a\\n' > a.txt && printf 'b\\n' > b.txt"


@dataclass
class Broker:
    url: str
    http: httpx.Client

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 60) -> Any:
        answer = self.http.request(method, self.url + path, json=body, timeout=timeout_s)
        if answer.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
        return answer.json() if answer.content else None

    def exec(self, lease: str, script: str, timeout_s: float = 30, **fields: Any) -> dict[str, Any]:
        body = {"argv": ["/bin/sh", "-c", script, *fields.pop("args", [])], "timeout_s": timeout_s, **fields}
        result: dict[str, Any] = self.call("POST", f"/leases/{lease}/exec", body, timeout_s + 30)
        return result


@contextmanager
def local_broker(logs: Path, redis_url: str, agents_dir: Path) -> Iterator[Broker]:
    """A broker on the local backend (authentication on, as deployed) binding ``agents_dir``."""
    state = Path(tempfile.mkdtemp(prefix="bench-agents-broker-"))
    state.chmod(0o755)  # the sandbox user must reach the sandboxes' directories
    secrets = FleetSecrets.generate()
    port = free_port()
    argv = [sys.executable, "-m", "services.cli", "broker", "--port", str(port), "--backend", "local",
            "--redis-url", redis_url, "--state-dir", str(state)]  # fmt: skip
    env = {**secrets.env(), "ROLLOUT_BROKER_AGENTS_DIR": str(agents_dir)}
    started = launch("broker", argv, f"http://127.0.0.1:{port}", "/healthz", logs, env=env)
    http = httpx.Client(headers={"Authorization": f"Bearer {secrets.service_token}"})
    try:
        yield Broker(started.url, http)
    finally:
        http.close()
        started.stop()
        remove_state_dir(state)


def gateway_env(sid: str, token: str) -> dict[str, str]:
    """What the worker gives an agent in the sandbox (``OpenSession.env`` at the relay's address)."""
    base = f"http://127.0.0.1:{PORT}/e/{sid}"
    return {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": token, "OPENAI_MODEL": MODEL,
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": token, "ANTHROPIC_MODEL": MODEL}  # fmt: skip


def run_inside(broker: Broker, proxy_url: str, harness: Harness, inside: Inside, session: tuple[str, str],
               tag: str, answer: str, timeout_s: float) -> str:  # fmt: skip
    """One episode in a fresh sandbox; what went wrong ("" when it finished)."""
    sid, token = session
    lease = broker.call("POST", "/leases", {"job": "bench-agents", "ttl_s": timeout_s + 120, "wait_s": 120}, 300)
    try:
        broker.exec(lease["id"], FILES)
        bind = {"session": sid, "upstream": proxy_url, "ttl_s": timeout_s + 60}
        broker.call("POST", f"/leases/{lease['id']}/gateway", bind)
        script = f"PATH={AGENTS_DIR}/{inside.bundle}/bin:$PATH; export PATH\n{inside.script}"
        args = ["sh", "--auto-test", "--test-cmd", aider_test(tag)] if harness.edit else []
        env = {**gateway_env(sid, token), "ROLLOUT_TASK": tag, **QUIET}
        done = broker.exec(lease["id"], script, timeout_s, args=args, env=env, gateway_port=PORT,
                           max_output_bytes=65_536)  # fmt: skip
        out = str(done["stdout"])
        if done.get("timed_out"):
            return f"timed out after {timeout_s:g} s"
        if done["exit_code"] != 0:
            return f"exit {done['exit_code']}: {str(done['stderr']).strip()[-300:]}"
        if harness.answer_on_stdout and not out.strip().endswith(answer):
            return f"unexpected answer: {out.strip()[-200:]}"
        if harness.edit:
            held = str(broker.exec(lease["id"], "cat ANSWER.txt")["stdout"])
            if answer not in held:
                return f"ANSWER.txt holds {held[-200:]!r}"
        return ""
    finally:
        broker.call("DELETE", f"/leases/{lease['id']}")

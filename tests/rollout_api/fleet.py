"""A whole rollout fleet as real processes for end-to-end tests: Redis, scripted engines, the
LLM proxy, the sandbox broker (local backend), the rollout API, workers."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.benchmarks import chaos_fleet
from services.protocol import Trajectory, trajectory_from_json
from services.rollout_api.dump import stream_entries
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.secrets import FleetSecrets
from services.runtime.sync_redis import open_sync_redis
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.backends.leftovers import remove_state_dir
from tests.support.processes import ServiceProcess, launch_service, start_service, wait_started

ADMIN = "e2e-admin"
SECRETS = FleetSecrets(admin_token=ADMIN, service_token="e2e-service", redis_password="")  # every service authenticates
SUBMIT = chaos_fleet.SUBMIT  # a scripted reply that ends the episode
WORKER_ENV = chaos_fleet.FAST_LIVENESS_ENV  # reclaim, cancellation and retries within seconds (the chaos bench's too)


@dataclass
class Fleet:
    redis_url: str
    model_path: Path
    logs: Path
    api: ServiceProcess
    proxy: ServiceProcess
    broker: ServiceProcess
    engines: dict[str, ServiceProcess]
    workers: list[ServiceProcess] = field(default_factory=list)
    state_dir: Path = Path()  # the broker's, reachable by the sandbox user
    redis: EmbeddedRedis | None = None  # the server, for tests that stop or restart it

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.api.url, timeout=30.0)

    def start_worker(self, *, jobs: list[str] | None = None, concurrency: int = 16, **env: str) -> ServiceProcess:
        args = [
            "-m", "services.cli", "worker", "--port", "{port}", "--redis-url", self.redis_url,
            "--proxy-url", self.proxy.url, "--broker-url", self.broker.url, "--model-path", str(self.model_path),
            "--concurrency", str(concurrency),
        ]  # fmt: skip
        if jobs:
            args += ["--jobs", ",".join(jobs)]
        secrets = {k: v for k, v in SECRETS.env().items() if k != "ROLLOUT_ADMIN_TOKEN"}  # as deployed: none
        worker = start_service(args, log_dir=self.logs, env={**secrets, **WORKER_ENV, **env}, name="worker")
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for service in [*self.workers, self.api, self.proxy, self.broker, *self.engines.values()]:
            service.stop()


def create_job(client: httpx.Client, job: str, **extra: Any) -> dict[str, str]:
    response = client.post("/jobs", json={"job": job, **extra}, headers=bearer(ADMIN))
    assert response.status_code == 201, response.text
    return bearer(response.json()["token"])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit(client: httpx.Client, headers: dict[str, str], body: dict[str, Any]) -> str:
    response = client.post("/rollouts", json=body, headers=headers)
    assert response.status_code == 202, response.text
    rollout_id: str = response.json()["rollout_id"]
    return rollout_id


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy (a bound for a test that would hang, not a timing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"gave up waiting for {what}; last value {check()!r}")


def wait_finished(client: httpx.Client, headers: dict[str, str], rollout_id: str, timeout_s: float = 60.0) -> Any:
    def done() -> Any:
        status = client.get(f"/rollouts/{rollout_id}", headers=headers).json()
        return status if status["finished"] >= status["total"] else None

    return wait_for(f"rollout {rollout_id} to finish", done, timeout_s)


def trajectories(redis_url: str, job: str) -> list[Trajectory]:
    client = open_sync_redis(redis_url)
    try:
        return [traj for _, traj in stream_entries(client, job)]
    finally:
        client.close()


def sse_trajectories(client: httpx.Client, path: str, headers: dict[str, str]) -> list[Trajectory]:
    with client.stream("GET", path, headers=headers) as response:
        return [trajectory_from_json(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def task(task_id: str, prompt: str, *, answer_check: bool = True, **extra: Any) -> dict[str, Any]:
    reward = 'test "$(cat answer.txt 2>/dev/null)" = 42' if answer_check else "true"
    return {"id": task_id, "prompt": prompt, "reward": {"command": reward}, **extra}


def write_script(path: Path, rules: dict[str, list[Any]]) -> Path:
    doc = {"rules": [{"match": m, "replies": r} for m, r in rules.items()], "default": "I give up.", "latency_s": 0.0}
    path.write_text(json.dumps(doc))
    return path


def launch_engine(script: Path, model_path: Path, logs: Path, name: str) -> ServiceProcess:
    args = [
        "-m", "services.cli", "engine", "--mode", "scripted", "--script", str(script),
        "--model-path", str(model_path), "--port", "{port}",
    ]  # fmt: skip
    return launch_service(args, log_dir=logs, name=name)


def start_fleet(
    redis_url: str, script: Path, model_path: Path, logs: Path, state_dir: Path, api_env: dict[str, str] | None = None,
    broker_env: dict[str, str] | None = None, context_cap: int = 4000, backend: str = "local",
) -> Fleet:  # fmt: skip
    """The engines and the broker start at once, the proxy once the engines answer and the API once
    the broker does (each as it would be deployed: its dependencies up before it)."""
    started: list[ServiceProcess] = []
    try:
        engines = {"default": launch_engine(script, model_path, logs, "engine")}
        started.append(engines["default"])
        engines["llmfail"] = launch_engine(script, model_path, logs, "engine-llmfail")
        started.append(engines["llmfail"])
        broker = launch_service(
            [
                "-m", "services.cli", "broker", "--port", "{port}", "--backend", backend,
                "--redis-url", redis_url, "--state-dir", str(state_dir),
            ],
            log_dir=logs, name="broker",
            env={**SECRETS.env(), "ROLLOUT_BROKER_TEMPLATE_ROOTS": tempfile.gettempdir(), **(broker_env or {})},
        )  # fmt: skip
        started.append(broker)
        for engine in engines.values():
            wait_started(engine, "/health")
        proxy = launch_service(
            [
                "-m", "services.cli", "proxy", "--port", "{port}", "--workers", "1",
                "--engines", engines["default"].url, "--pools", f"llmfail={engines['llmfail'].url}",
                "--context-cap", str(context_cap), "--health-interval-s", "0.5", "--eject-after-failures", "1",
            ],
            log_dir=logs, env={**SECRETS.env(), "ROLLOUT_REDIS_URL": redis_url}, name="proxy",
        )  # fmt: skip
        started.append(proxy)
        wait_started(broker, timeout_s=120)  # its host probe (bubblewrap) may take up to a minute on a loaded machine
        api = launch_service(
            [
                "-m", "services.cli", "api", "--port", "{port}", "--redis-url", redis_url, "--broker-url", broker.url,
                "--proxy-url", proxy.url, "--tokenizer-path", str(model_path),
            ],
            log_dir=logs, env={**SECRETS.env(), "ROLLOUT_API_DASHBOARD_SAMPLE_S": "1", **(api_env or {})}, name="api",
        )  # fmt: skip
        started.append(api)
        wait_started(proxy)
        wait_started(api)
    except BaseException:
        for service in started:
            service.stop()
        raise
    return Fleet(redis_url, model_path, logs, api, proxy, broker, engines, state_dir=state_dir)


@contextmanager
def running_fleet(
    root: Path, rules: dict[str, list[Any]], name: str, api_env: dict[str, str] | None = None,
    broker_env: dict[str, str] | None = None, context_cap: int = 4000, backend: str = "local",
) -> Iterator[Fleet]:  # fmt: skip
    """Redis, scripted engines answering ``rules``, the proxy, the broker (on ``backend``: docker
    takes its engine from ``broker_env``) and the API (no worker yet: ``fleet.start_worker``),
    stopped and cleaned up afterwards."""
    model = write_tokenizer_dir(root / "model")
    script = write_script(root / "script.json", rules)
    state = Path(tempfile.mkdtemp(prefix=f"rollout-{name}-"))
    state.chmod(0o755)  # the sandbox user must reach the sandboxes' directories (pytest's tmp root is 0700)
    with EmbeddedRedis() as server:
        fleet = start_fleet(server.url, script, model, root / "logs", state, api_env, broker_env, context_cap, backend)
        fleet.redis = server
        try:
            yield fleet
        finally:
            fleet.stop()
            assert remove_state_dir(state) == [], "mounts leaked under the state dir"

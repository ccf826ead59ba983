"""The fleet of ``rollout bench chaos``: real processes on loopback that a scenario may kill -9 and
start again on the same address.

Redis (embedded, AOF on, a fixed port and data directory, so a restarted server comes back with
what it had), two scripted engines behind a 2-process proxy, the broker (local sandboxes), the API
and two workers with fast liveness settings (reclaim, renewals and cancellation within seconds).
Every service runs with the fleet's secrets, as deployed.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.runtime.processes import ServiceProcess, start_service
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.secrets import FleetSecrets
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.reaper import ORPHAN_GRACE_S

SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
PROMPT = "CHAOS-TASK"
REWARD = 'test "$(cat answer.txt 2>/dev/null)" = 42'  # 1.0 when the episode really ran

# Fast liveness settings so that reclaim, cancellation and retries happen within seconds (the
# end-to-end tests' fleet, tests/rollout_api/fleet.py, runs its workers with them too).
FAST_LIVENESS_ENV = {
    "ROLLOUT_WORKER_HEARTBEAT_S": "0.5",
    "ROLLOUT_WORKER_RECLAIM_IDLE_S": "3",
    "ROLLOUT_WORKER_RECLAIM_INTERVAL_S": "0.5",
    "ROLLOUT_WORKER_RETRY_BACKOFF_S": "0.2",
    "ROLLOUT_WORKER_LEASE_TTL_S": "30",
    "ROLLOUT_WORKER_CANCEL_POLL_S": "0.2",
    "ROLLOUT_WORKER_JOBS_REFRESH_S": "0.3",
    "ROLLOUT_WORKER_POLL_INTERVAL_S": "0.05",
    "ROLLOUT_WORKER_SHUTDOWN_GRACE_S": "2",
}
WORKER_ENV = {**FAST_LIVENESS_ENV, "ROLLOUT_WORKER_LEASE_WAIT_S": "15"}
# A lease whose creation was cut short (its broker killed, Redis away) stays reserved until its
# create deadline (the worker's wait + the broker's create timeout); the timeout is shorter than the
# default 120 s so that the bench sees it reaped within a scenario or two (``--create-timeout-s``).
CREATE_TIMEOUT_S, ORPHAN_INTERVAL_S = 45.0, 5.0
REAP_MARGIN_S = 12.0  # the broker's reap interval (2 s) and then some: a lease this far past its deadline leaked


def script(latency_s: float) -> dict[str, Any]:
    """Three turns: two commands whose effect the reward checks, then the submission."""
    replies = [
        {"text": "```bash\necho 4 > a.txt\n```", "latency_s": latency_s},
        {"text": "```bash\necho 42 > answer.txt\n```", "latency_s": latency_s},
        {"text": SUBMIT, "latency_s": latency_s},
    ]
    return {"rules": [{"match": PROMPT, "replies": replies}], "default": "I give up.", "latency_s": 0.0}


def task(task_id: str) -> dict[str, Any]:
    return {"id": task_id, "prompt": f"{PROMPT} {task_id}", "reward": {"command": REWARD}}


@dataclass
class ChaosFleet:
    root: Path
    redis: EmbeddedRedis
    secrets: FleetSecrets
    worker_concurrency: int
    create_timeout_s: float = CREATE_TIMEOUT_S
    services: dict[str, ServiceProcess] = field(default_factory=dict)  # api, proxy, broker, engine-0, engine-1
    workers: list[ServiceProcess] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_dir(self) -> Path:
        return self.root / "sandboxes"

    @property
    def orphan_age_s(self) -> float:
        """A sandbox no lease accounts for is the orphan sweep's once it is older than the create
        timeout and the sweep's grace, at the next sweep: one older than this on the host leaked."""
        return self.create_timeout_s + ORPHAN_GRACE_S + ORPHAN_INTERVAL_S + REAP_MARGIN_S

    @property
    def api_url(self) -> str:
        return self.services["api"].url

    def env(self, role: str) -> dict[str, str]:
        env = {**self.secrets.env(), "ROLLOUT_REDIS_URL": self.redis.url}
        if role == "worker":
            env.pop("ROLLOUT_ADMIN_TOKEN", None)  # as deployed: a worker has none
            env.update(WORKER_ENV)
        if role == "broker":
            env.update(ROLLOUT_BROKER_CREATE_TIMEOUT_S=f"{self.create_timeout_s:g}",
                       ROLLOUT_BROKER_ORPHAN_INTERVAL_S=f"{ORPHAN_INTERVAL_S:g}")  # fmt: skip
        return env

    def start(self, role: str, args: list[str], *, health: str = "/healthz") -> ServiceProcess:
        argv = ["-m", "services.cli", *args]
        return start_service(argv, log_dir=self.logs, env=self.env(role), health_path=health, timeout_s=120.0,
                             name=role)  # fmt: skip

    def start_all(self, model: Path, script_path: Path) -> None:
        for i in range(2):
            self.services[f"engine-{i}"] = self.start("engine", [
                "engine", "--mode", "scripted", "--script", str(script_path), "--model-path", str(model),
                "--port", "{port}",
            ], health="/health")  # fmt: skip
        engines = ",".join(self.services[f"engine-{i}"].url for i in range(2))
        self.services["proxy"] = self.start("proxy", [
            "proxy", "--port", "{port}", "--workers", "2", "--engines", engines,
            "--health-interval-s", "0.5", "--eject-after-failures", "1",
        ])  # fmt: skip
        self.services["broker"] = self.start("broker", [
            "broker", "--port", "{port}", "--backend", "local", "--redis-url", self.redis.url,
            "--state-dir", str(self.state_dir),
        ])  # fmt: skip
        self.services["api"] = self.start("api", [
            "api", "--port", "{port}", "--redis-url", self.redis.url, "--broker-url", self.services["broker"].url,
            "--proxy-url", self.services["proxy"].url, "--tokenizer-path", str(model),
        ])  # fmt: skip
        for _ in range(2):
            self.start_worker()

    def start_worker(self) -> ServiceProcess:
        worker = self.start("worker", [
            "worker", "--port", "{port}", "--redis-url", self.redis.url, "--proxy-url", self.services["proxy"].url,
            "--broker-url", self.services["broker"].url, "--model-path", str(self.root / "model"),
            "--concurrency", str(self.worker_concurrency),
        ])  # fmt: skip
        self.workers.append(worker)
        return worker

    def kill(self, name: str) -> None:
        """kill -9 the service's whole process group (a proxy's children too)."""
        self.services[name].kill(signal.SIGKILL)

    def restart(self, name: str) -> ServiceProcess:
        """The same command on the same port (the broker keeps its instance name, so its leases)."""
        old = self.services[name]
        role = name.split("-")[0]
        health = "/health" if role == "engine" else "/healthz"
        self.services[name] = start_service(old.argv[1:], log_dir=self.logs, port=old.port, env=self.env(role),
                                            health_path=health, timeout_s=120.0, name=f"{name}-restarted")  # fmt: skip
        return self.services[name]

    def stop(self) -> None:
        """Every service, even when one of them does not stop in time."""
        for service in [*self.workers, *reversed(self.services.values())]:
            try:
                service.stop(timeout_s=15)
            except Exception:  # the next ones must still be stopped
                service.kill(signal.SIGKILL)

    def sandboxes(self) -> dict[str, float]:
        """The local backend's sandboxes on the host: id -> age in seconds (from their directory)."""
        root = self.state_dir / "sandboxes"
        now = time.time()
        found = {}
        for path in root.iterdir() if root.is_dir() else []:
            try:
                found[path.name] = now - path.stat().st_ctime
            except OSError:
                continue  # removed meanwhile
        return found

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets.admin_token}"}


def start_chaos_fleet(
    root: Path, *, latency_s: float, worker_concurrency: int, create_timeout_s: float = CREATE_TIMEOUT_S
) -> ChaosFleet:
    """Redis with AOF and every service; stopped again if any of them fails to start."""
    root.chmod(0o755)  # the sandbox user must reach the sandboxes' directories
    (root / "logs").mkdir()
    (root / "sandboxes").mkdir(mode=0o755)
    model = write_tokenizer_dir(root / "model")
    script_path = root / "script.json"
    script_path.write_text(json.dumps(script(latency_s)))
    redis = EmbeddedRedis(appendonly=True, data_dir=root / "redis")
    redis.start()
    fleet = ChaosFleet(root, redis, FleetSecrets.generate(), worker_concurrency, create_timeout_s)
    try:
        fleet.start_all(model, script_path)
    except BaseException:
        fleet.stop()
        redis.stop()
        raise
    return fleet


def wait_until(what: str, check: Any, timeout_s: float, every_s: float = 0.2) -> Any:
    """Poll ``check()`` until truthy; HTTP errors count as not yet (a service may be down)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except (httpx.HTTPError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout_s:g} s")
        time.sleep(every_s)

"""Start the platform's services as real processes on loopback, in dependency order.

Redis (embedded unless a URL is given), the engines, the LLM proxy, the sandbox broker (local
backend), the rollout API and the workers. Every process logs to ``<work_dir>/logs``; ``stop()``
ends them in reverse order, then removes the sandboxes the broker kept for leases still live (a
broker keeps those for its own restart, which a stopped fleet never has). Every secret (admin and
service tokens, the Redis password) is generated for the run and handed over in the environment,
never on a command line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.protocol.fields import DEFAULT_POOL
from services.runtime.processes import ServiceProcess, start_service
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.secrets import FleetSecrets
from services.sandbox_broker.backends import leftovers

log = logging.getLogger(__name__)


@dataclass
class FleetConfig:
    work_dir: Path
    model_dir: Path  # HF model + tokenizer served by the engines and used by the workers
    engine_mode: str = "torch"
    engines: int = 1
    proxy_workers: int = 1
    worker_concurrency: int = 32
    context_tokens: int = 65_536  # the engines' context length and the proxy's context cap
    redis_url: str | None = None
    pools: tuple[str, ...] = (DEFAULT_POOL,)  # engine i serves pools[i % len(pools)] (a pool may repeat)


@dataclass
class Fleet:
    config: FleetConfig
    secrets: FleetSecrets = field(default_factory=FleetSecrets.generate)
    redis: EmbeddedRedis | None = None
    redis_url: str = ""
    services: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.config.work_dir / "logs"

    @property
    def sandbox_state(self) -> Path:
        """The broker's state dir (absolute: the services run in the repository root)."""
        return (self.config.work_dir / "sandboxes").resolve()

    def url(self, name: str) -> str:
        return self.services[name].url

    def start(self) -> None:
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise

    def _start_all(self) -> None:
        cfg = self.config
        if cfg.redis_url:
            self.redis_url = cfg.redis_url
        else:
            self.redis = EmbeddedRedis(data_dir=cfg.work_dir / "redis", password=self.secrets.redis_password)
            self.redis_url = self.redis.start()
        env = {**self.secrets.env(), "ROLLOUT_REDIS_URL": self.redis_url}  # the shared settings every service reads
        for i in range(cfg.engines):
            self._start(f"engine-{i}", [
                "engine", "--mode", cfg.engine_mode, "--model-path", str(cfg.model_dir), "--port", "{port}",
                "--weight-version", "0", "--decode-step-s", "0", "--decode-step-per-request-s", "0",
                "--prefill-s-per-token", "0", "--context-length", str(cfg.context_tokens),
            ], env, health="/health")  # fmt: skip
        pools = ";".join(f"{pool}={','.join(urls)}" for pool, urls in self.pool_engines().items())
        self._start("proxy", [
            "proxy", "--port", "{port}", "--workers", str(cfg.proxy_workers), "--pools", pools,
            "--context-cap", str(cfg.context_tokens), "--max-new-tokens-cap", "512",
        ], env)  # fmt: skip
        self._start("broker", [
            "broker", "--port", "{port}", "--backend", "local",
            "--state-dir", str(self.sandbox_state), "--warm-pool", "8",
        ], env)  # fmt: skip
        self._start("api", [
            "api", "--port", "{port}", "--broker-url", self.url("broker"),
            "--proxy-url", self.url("proxy"), "--tokenizer-path", str(cfg.model_dir),
        ], env)  # fmt: skip
        worker_env = {k: v for k, v in env.items() if k != "ROLLOUT_ADMIN_TOKEN"}  # a worker needs no admin token
        self._start("worker", [
            "worker", "--port", "{port}", "--proxy-url", self.url("proxy"),
            "--broker-url", self.url("broker"), "--model-path", str(cfg.model_dir),
            "--concurrency", str(cfg.worker_concurrency),
        ], worker_env)  # fmt: skip

    def _start(self, name: str, args: list[str], env: dict[str, str], health: str = "/healthz") -> None:
        service = start_service(
            ["-m", "services.cli", *args], log_dir=self.logs, env=env, health_path=health, name=name, timeout_s=300
        )
        self.services[name] = service
        log.info("%-8s %s (log %s)", name, service.url, service.log_path)

    def pool_engines(self) -> dict[str, list[str]]:
        """Each pool's engine URLs (engine i serves pool i modulo the number of pools)."""
        pools = self.config.pools
        found: dict[str, list[str]] = {}
        for i, url in enumerate(s.url for n, s in self.services.items() if n.startswith("engine-")):
            found.setdefault(pools[i % len(pools)], []).append(url)
        return found

    def dashboard_url(self) -> str:
        """The dashboard with the admin token in the fragment (never sent to the server, never logged)."""
        return f"{self.url('api')}/ui/#token={self.secrets.admin_token}"

    def create_job(self, job: str, pool: str = DEFAULT_POOL, weight: float = 1.0) -> str:
        """Create ``job`` (served by ``pool``, ``weight`` its fair share) through the API; returns its bearer token."""
        response = httpx.post(
            self.url("api") + "/jobs",
            json={"job": job, "pool": pool, "weight": weight},
            headers={"Authorization": f"Bearer {self.secrets.admin_token}"},
            timeout=30,
        )
        response.raise_for_status()
        token: str = response.json()["token"]
        return token

    def stop(self) -> None:
        for name in reversed(list(self.services)):
            self.services[name].stop()
        if "broker" in self.services:  # it kept the sandboxes of live leases for a restart that will not come
            removed = leftovers.remove_sandboxes(self.sandbox_state)
            log.info("removed %d sandboxes the stopped broker left", len(removed))
        self.services.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

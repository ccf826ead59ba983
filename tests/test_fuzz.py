"""Property-based fuzzing of every service's OpenAPI document with schemathesis (issue 9):
authenticated, positive and negative cases, the only check being that no call gets a 5xx.

Each service runs as a real process against real Redis, with real tokens; each run is bounded
by ``--max-time`` so the whole module stays within about two minutes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.protocol import keys
from services.protocol.llm import HEADER_JOB
from services.runtime.auth import hash_token
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.secrets import FleetSecrets
from services.sandbox_broker.backends.leftovers import remove_state_dir
from tests.llm_proxy.fleet import start_engines
from tests.support.processes import ServiceProcess, start_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("schemathesis")

SECRETS = FleetSecrets(admin_token="fuzz-admin", service_token="fuzz-service", redis_password="")
JOB_TOKEN = "fuzz-job-token"
MAX_TIME_S = 25


def fuzz(base_url: str, token: str, *extra: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """schemathesis runs in ``cwd`` (the module's log directory): it keeps its example cache in a
    ``.schemathesis`` directory there, which in the checkout was a file the tests rewrote."""
    argv = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{base_url}/openapi.json", "--url", base_url,
        "--checks", "not_a_server_error", "--mode", "all", "--max-examples", "25", "--max-time", str(MAX_TIME_S),
        "--request-timeout", "20", "--seed", "9", "--header", f"Authorization: Bearer {token}",
        "--suppress-health-check", "all", *extra,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=MAX_TIME_S + 120, check=False, cwd=cwd)


def assert_no_server_error(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-logs")


@pytest.fixture(scope="module")
def seeded(redis_server: EmbeddedRedis) -> str:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.hset(keys.job_tokens(), hash_token(JOB_TOKEN), "fuzz")
    client.hset(keys.job_record("fuzz"), mapping={"job": "fuzz", "pool": "default"})
    client.close()
    return redis_server.url


def _service(argv: list[str], logs: Path, env: dict[str, str], name: str) -> Iterator[ServiceProcess]:
    service = start_service(["-m", "services.cli", *argv], log_dir=logs, env=env, name=name, timeout_s=60)
    try:
        yield service
    finally:
        service.stop()


def test_fuzz_the_rollout_api(seeded: str, logs: Path) -> None:
    env = {**SECRETS.env(), "ROLLOUT_REDIS_URL": seeded}
    for api in _service(["api", "--port", "{port}"], logs, env, "api"):
        assert httpx.get(api.url + "/jobs/fuzz", timeout=10).status_code == 401
        assert_no_server_error(fuzz(api.url, SECRETS.admin_token, cwd=logs))


def test_fuzz_the_broker(seeded: str, logs: Path) -> None:
    """Lease creation (one or a batch) is left out: each would start a real sandbox. Every other route is fuzzed."""
    state = Path(tempfile.mkdtemp(prefix="rollout-broker-fuzz-"))
    state.chmod(0o711)
    env = {**SECRETS.env(), "ROLLOUT_REDIS_URL": seeded, "ROLLOUT_BROKER_STATE_DIR": str(state),
           "ROLLOUT_BROKER_TEMPLATE_ROOTS": str(state)}  # fmt: skip
    try:
        for broker in _service(["broker", "--port", "{port}"], logs, env, "broker"):
            result = fuzz(broker.url, SECRETS.admin_token, "--exclude-path-regex", "^/leases(/batch)?$", cwd=logs)
            assert_no_server_error(result)
            assert_no_server_error(fuzz(broker.url, JOB_TOKEN, "--exclude-path-regex", "^/leases(/batch)?$", cwd=logs))
    finally:
        assert remove_state_dir(state) == [], "mounts leaked under the state dir"


def test_fuzz_the_proxy(seeded: str, logs: Path) -> None:
    """The data plane with the workers' token; the admin API answers it 403 whatever the body."""
    engines, urls = start_engines(logs, 1, "--decode-step-s", "0.001")
    # every generation ends well inside the smallest deadline a caller may ask for (X-Deadline-S >= 1 s):
    # at most 256 new tokens at 1 ms a step
    env = {**SECRETS.env(), "ROLLOUT_REDIS_URL": seeded, "ROLLOUT_PROXY_ENGINE_CALL_TIMEOUT_S": "5",
           "ROLLOUT_PROXY_MAX_NEW_TOKENS_CAP": "256"}  # fmt: skip
    try:
        argv = ["proxy", "--port", "{port}", "--workers", "1", "--engines", urls[0]]
        for proxy in _service(argv, logs, env, "proxy"):
            result = fuzz(proxy.url, SECRETS.service_token, "--header", f"{HEADER_JOB}: fuzz", cwd=logs)
            assert_no_server_error(result)
    finally:
        engines.stop()

"""The e2b backend through the real ``e2b`` SDK against the local fake of E2B's service (REST
lifecycle + Connect-RPC envd running commands in real bubblewrap sandboxes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.llm_proxy.fleet import wait_until
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run
from tests.support.processes import ServiceProcess, start_service

pytestmark = [needs_bwrap, pytest.mark.slow]


@pytest.fixture
def fake_e2b(state_dir: Path, service_logs: Path) -> Iterator[ServiceProcess]:
    fake_dir = state_dir / "fake-e2b"
    fake_dir.mkdir()
    fake_dir.chmod(0o711)
    argv = ["-m", "services.sandbox_broker.fakes.e2b", "--port", "{port}", "--state-dir", str(fake_dir)]
    service = start_service(argv, log_dir=service_logs, health_path="/_fake/stats", name="fake-e2b")
    yield service
    service.stop()


def _env(fake: ServiceProcess) -> dict[str, str]:
    return {"ROLLOUT_BROKER_E2B_API_URL": fake.url, "ROLLOUT_BROKER_E2B_SANDBOX_URL": fake.url,
            "ROLLOUT_BROKER_E2B_API_KEY": "test-key", "ROLLOUT_BROKER_E2B_WORKDIR": "/workspace"}  # fmt: skip


def _alive(fake: ServiceProcess) -> int:
    return int(httpx.get(fake.url + "/_fake/stats").json()["alive"])


def test_e2b_lease_exec_files_and_release(fake_e2b: ServiceProcess, start_broker: BrokerFactory) -> None:
    broker = start_broker("--backend", "e2b", env=_env(fake_e2b))
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        held = lease(client, job="ej")
        assert held["backend"] == "e2b" and held["sandbox_id"].startswith("sbx")
        failed = run(client, held["id"], "echo out; echo err >&2; exit 3")  # CommandExitException -> a result
        assert (failed["exit_code"], failed["stdout"], failed["stderr"]) == (3, "out\n", "err\n")
        assert client.post(f"/leases/{held['id']}/exec", json={"argv": ["cat"], "stdin": "in"}).json()["stdout"] == "in"
        slow = run(client, held["id"], "sleep 30", timeout_s=1)
        assert slow["timed_out"] is True and slow["exit_code"] == 124

        client.put(f"/leases/{held['id']}/files", params={"path": "d/f.txt"}, content=b"data")
        assert run(client, held["id"], "cat /workspace/d/f.txt")["stdout"] == "data"
        assert client.get(f"/leases/{held['id']}/files", params={"path": "d/f.txt"}).content == b"data"
        assert client.post(f"/leases/{held['id']}/renew", json={"ttl_s": 120}).status_code == 200
        assert _alive(fake_e2b) == 1
        assert client.delete(f"/leases/{held['id']}").status_code == 204
        assert _alive(fake_e2b) == 0


def test_e2b_failures_are_classified(fake_e2b: ServiceProcess, start_broker: BrokerFactory) -> None:
    broker = start_broker("--backend", "e2b", env=_env(fake_e2b))
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        stats = httpx.post(fake_e2b.url + "/_fake/faults", json={"create_429": 2}).json()
        held = lease(client)  # two 429s, retried with backoff
        assert httpx.get(fake_e2b.url + "/_fake/stats").json()["rate_limited"] == stats["rate_limited"] + 2

        httpx.post(fake_e2b.url + "/_fake/faults", json={"envd_502": 1})
        bad_gateway = client.post(f"/leases/{held['id']}/exec", json={"shell": "true", "timeout_s": 30})
        assert bad_gateway.status_code == 502  # the SDK calls it a timeout; it came long before the deadline
        assert bad_gateway.json()["error"]["code"] == "transport_error" and bad_gateway.json()["error"]["infra"]
        assert run(client, held["id"], "echo fine")["stdout"] == "fine\n"

        httpx.delete(fake_e2b.url + f"/sandboxes/{held['sandbox_id']}", headers={"x-api-key": "k"})
        died = client.post(f"/leases/{held['id']}/exec", json={"shell": "true"})
        assert died.status_code == 410 and died.json()["error"]["code"] == "sandbox_died"
        assert died.json()["error"]["infra"] is True


def test_e2b_restart_recovers_by_metadata(fake_e2b: ServiceProcess, start_broker: BrokerFactory) -> None:
    broker = start_broker("--backend", "e2b", "--warm-pool", "1", env=_env(fake_e2b))
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        held = lease(client)
        run(client, held["id"], "echo kept > k.txt")
        # the lease's and the pool's (a lease that took the warm sandbox leaves the refill in flight)
        wait_until(lambda: _alive(fake_e2b) == 2, timeout_s=60, what="the lease's and the pool's sandbox")
    broker.kill()
    restarted = start_broker("--backend", "e2b", env=_env(fake_e2b))
    with httpx.Client(base_url=restarted.url, timeout=60) as client:
        assert run(client, held["id"], "cat k.txt")["stdout"] == "kept\n"  # reconnected by id
        assert _alive(fake_e2b) == 1  # the old pool's sandbox was found by metadata and killed
        client.delete(f"/leases/{held['id']}")
    assert _alive(fake_e2b) == 0

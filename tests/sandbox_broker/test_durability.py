"""Leases outlive the broker process: heartbeat expiry, recovery after kill -9, replicas sharing
one Redis that never reap a lease twice, and the orphan reaper."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from services.protocol import keys
from services.sandbox_broker.backends import overlay
from services.sandbox_broker.backends.cgroups import Cgroups
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run

pytestmark = needs_bwrap

FAST_REAPER = {"ROLLOUT_BROKER_REAP_INTERVAL_S": "0.2", "ROLLOUT_BROKER_ORPHAN_INTERVAL_S": "0.5"}


def _eventually(check: Callable[[], bool], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _sandboxes(state_dir: Path) -> set[str]:
    root = state_dir / "sandboxes"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def _reaped(url: str, reason: str) -> float:
    text = httpx.get(url + "/metrics").text
    found = re.search(rf'rollout_broker_sandboxes_reaped_total{{reason="{reason}"}} ([0-9.]+)', text)
    return float(found.group(1)) if found else 0.0


def test_a_lease_without_heartbeats_is_reaped(start_broker: BrokerFactory, state_dir: Path) -> None:
    broker = start_broker(env=FAST_REAPER)
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        short = lease(client, ttl_s=1)
        kept = lease(client, ttl_s=5)
        for _ in range(4):  # heartbeats keep this one alive (with room for a slow, shared machine)
            time.sleep(0.5)
            assert client.post(f"/leases/{kept['id']}/renew", json={"ttl_s": 5}).status_code == 200
        assert _eventually(lambda: short["sandbox_id"] not in _sandboxes(state_dir))
        assert client.get(f"/leases/{short['id']}").status_code == 404
        assert client.post(f"/leases/{short['id']}/renew", json={"ttl_s": 60}).status_code == 404
        assert run(client, kept["id"], "echo alive")["stdout"] == "alive\n"
        client.delete(f"/leases/{kept['id']}")

        dying = lease(client, ttl_s=1)  # reaped while its command runs: an infra error, not a result
        cut = client.post(f"/leases/{dying['id']}/exec", json={"shell": "sleep 20", "timeout_s": 30})
        assert cut.status_code == 410 and cut.json()["error"]["code"] == "sandbox_died"
        assert cut.json()["error"]["infra"] is True
        assert _eventually(lambda: _sandboxes(state_dir) == set())


def test_recovery_after_kill_9(start_broker: BrokerFactory, state_dir: Path, redis_client: redis.Redis) -> None:
    broker = start_broker("--warm-pool", "2", env=FAST_REAPER)
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        held = lease(client, job="survivor")
        run(client, held["id"], "echo kept > state.txt")
        doomed = lease(client, job="lost")
        assert _eventually(lambda: sum(client.get("/healthz").json()["pools"].values()) == 2)
    pooled = _sandboxes(state_dir) - {held["sandbox_id"], doomed["sandbox_id"]}
    assert len(pooled) == 2
    broker.kill()  # SIGKILL: no shutdown, the pool and the leases stay behind

    redis_client.delete(keys.lease(doomed["id"]))  # its record is lost: its sandbox is now an orphan
    restarted = start_broker(env=FAST_REAPER)  # same instance name, no warm pool this time
    with httpx.Client(base_url=restarted.url, timeout=30) as client:
        assert run(client, held["id"], "cat state.txt")["stdout"] == "kept\n"
        assert _sandboxes(state_dir) == {held["sandbox_id"]}  # the old pool and the orphan were reaped at start
        assert "rollout_broker_leases_recovered_total 1.0" in client.get("/metrics").text
        assert client.delete(f"/leases/{held['id']}").status_code == 204
    assert _sandboxes(state_dir) == set()


def test_replicas_share_redis_and_reap_each_lease_once(start_broker: BrokerFactory, state_dir: Path) -> None:
    replicas = [start_broker(instance=f"r{i}", env=FAST_REAPER) for i in range(2)]
    with httpx.Client(base_url=replicas[0].url, timeout=30) as first, httpx.Client(base_url=replicas[1].url) as second:
        for client in (first, first, first, second):
            lease(client, ttl_s=0.5, job="j")
        long = lease(second, job="j")
        # any replica serves any lease (the sandboxes live in the shared state directory)
        assert run(first, long["id"], "echo via-r0")["stdout"] == "via-r0\n"
        assert {x["id"] for x in first.get("/leases", params={"job": "j"}).json()} >= {long["id"]}
        assert _eventually(lambda: _sandboxes(state_dir) == {long["sandbox_id"]})
        assert _eventually(lambda: sum(_reaped(r.url, "expired") for r in replicas) == 4)  # counted after the destroy
        second.delete(f"/leases/{long['id']}")


def test_orphans_of_a_dead_replica_are_reaped(start_broker: BrokerFactory, state_dir: Path) -> None:
    dead = start_broker("--warm-pool", "1", instance="dead", env=FAST_REAPER)
    with httpx.Client(base_url=dead.url, timeout=30) as client:
        assert _eventually(lambda: sum(client.get("/healthz").json()["pools"].values()) == 1)
    dead.kill()
    survivor = start_broker(instance="survivor", env=FAST_REAPER)
    # the dead replica's heartbeat key expires, then its pool sandbox is nobody's
    assert _eventually(lambda: _sandboxes(state_dir) == set())
    assert _eventually(lambda: _reaped(survivor.url, "orphan") >= 1)  # counted once the destroy returns


def _cgroups(state_dir: Path) -> list[str]:
    return Cgroups("v1", scope=Cgroups.scope_of(state_dir / "sandboxes")).list_ids()


def _left_on_host(state_dir: Path) -> dict[str, object]:
    return {"dirs": _sandboxes(state_dir), "mounts": overlay.mounts_under(state_dir), "cgroups": _cgroups(state_dir)}


NOTHING: dict[str, object] = {"dirs": set(), "mounts": [], "cgroups": []}


def test_a_store_that_comes_back_empty_has_its_sandboxes_reaped(
    start_broker: BrokerFactory, state_dir: Path, redis_client: redis.Redis
) -> None:
    broker = start_broker(env=FAST_REAPER)
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        assert client.post("/templates", json={"name": "registered"}).status_code == 201
        held = [lease(client, job="vanished", resources={"disk_mb": 64}) for _ in range(2)]
        run(client, held[0]["id"], "nohup sleep 600 >/dev/null 2>&1 &")  # a process outliving its command
        assert run(client, held[1]["id"], "echo live")["stdout"] == "live\n"  # its record now in the cache
        assert len(_sandboxes(state_dir)) == 2
        redis_client.flushall()  # Redis restarted empty: the leases' records are gone, the sandboxes not

        assert _eventually(lambda: _sandboxes(state_dir) == set(), timeout_s=30)
        assert client.get("/healthz").json()["store_lost"]["times"] == 1
        # counted once each destroy returns, which can be after its directory is gone
        assert _eventually(lambda: _reaped(broker.url, "store_lost") == 2, timeout_s=30)
        assert "registered" in {t["name"] for t in client.get("/templates").json()}  # registered again
        gone = client.post(f"/leases/{held[1]['id']}/exec", json={"shell": "echo stale"})
        assert gone.status_code == 404, gone.text  # not served from the cached record
        fresh = lease(client, job="new")  # the broker serves on
        assert run(client, fresh["id"], "echo ok")["stdout"] == "ok\n"
        assert client.delete(f"/leases/{fresh['id']}").status_code == 204
    broker.stop()
    assert broker.log().count("Redis lost its state") == 1
    assert _left_on_host(state_dir) == NOTHING


def test_a_stop_leaves_no_sandbox_whose_lease_the_store_lost(
    start_broker: BrokerFactory, state_dir: Path, redis_client: redis.Redis
) -> None:
    broker = start_broker(env={"ROLLOUT_BROKER_REAP_INTERVAL_S": "600"})  # no pass of the reaper before the stop
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        kept = lease(client, job="kept")
        lost = [lease(client, job="vanished") for _ in range(2)]
    redis_client.delete(*(keys.lease(held["id"]) for held in lost))  # records lost, sandboxes young
    broker.stop()  # SIGTERM: the lost ones go; the one still leased stays for a restart
    assert _sandboxes(state_dir) == {kept["sandbox_id"]}
    restarted = start_broker(env=FAST_REAPER)
    with httpx.Client(base_url=restarted.url, timeout=30) as client:
        assert client.delete(f"/leases/{kept['id']}").status_code == 204
    restarted.stop()
    assert _left_on_host(state_dir) == NOTHING

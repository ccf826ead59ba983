"""The broker's tokens, attacked route by route: no token, a wrong token, another job's token, the
owner's token, the service and the admin token (issue 9's cross-job matrix for the broker)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.protocol import keys
from services.runtime.auth import hash_token
from services.runtime.redis_server import EmbeddedRedis
from services.sandbox_broker.backends.leftovers import remove_state_dir
from tests.sandbox_broker.conftest import DEV_ENV, broker_args, needs_bwrap
from tests.support.processes import start_service

pytestmark = needs_bwrap

ADMIN, SERVICE, OLD_ADMIN = "adm-new", "svc-1", "adm-old"
TOKENS = {"none": None, "wrong": "not-a-token", "job-b": "tok-b", "job-a": "tok-a", "service": SERVICE,
          "admin": ADMIN, "old-admin": OLD_ADMIN}  # fmt: skip
ENV = {"ROLLOUT_BROKER_ALLOW_ANONYMOUS": "false", "ROLLOUT_SERVICE_TOKEN": SERVICE,
       # a rotation in progress: the new admin token in plain, the old one only as its hash
       "ROLLOUT_ADMIN_TOKEN": f"{ADMIN},sha256:{hash_token(OLD_ADMIN)}"}  # fmt: skip


def _headers(who: str) -> dict[str, str]:
    token = TOKENS[who]
    return {"Authorization": f"Bearer {token}"} if token else {}


def _lease_routes(lid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every route that names a lease, with a body that succeeds for whoever may call it."""
    return [
        ("GET", f"/leases/{lid}", {}),
        ("POST", f"/leases/{lid}/renew", {"json": {"ttl_s": 600}}),
        ("POST", f"/leases/{lid}/exec", {"json": {"shell": "echo hi > f.txt"}}),
        ("POST", f"/leases/{lid}/exec/stream", {"json": {"argv": ["true"]}}),
        ("PUT", f"/leases/{lid}/files", {"params": {"path": "g.txt"}, "content": b"x"}),
        ("GET", f"/leases/{lid}/files", {"params": {"path": "f.txt"}}),
        ("PUT", f"/leases/{lid}/archive", {"params": {"path": "d"}, "content": _empty_tar()}),
        ("GET", f"/leases/{lid}/archive", {"params": {"path": "d"}}),
    ]


def _empty_tar() -> bytes:
    return b"\0" * 1024


@pytest.fixture(scope="module")
def broker_url(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker with real tokens for the module (job tokens as the rollout API stores them)."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.hset(keys.job_tokens(), mapping={hash_token("tok-a"): "a", hash_token("tok-b"): "b"})
    client.close()
    state = Path(tempfile.mkdtemp(prefix="rollout-broker-auth-"))
    state.chmod(0o711)
    argv = broker_args(redis_server.url, state, "auth")
    service = start_service(
        argv, log_dir=tmp_path_factory.mktemp("logs"), env={**DEV_ENV, **ENV}, name="broker", timeout_s=120
    )
    try:
        yield service.url
    finally:
        service.stop()
        assert remove_state_dir(state) == [], "mounts leaked under the state dir"


def test_cross_job_matrix_over_every_lease_route(broker_url: str) -> None:
    with httpx.Client(base_url=broker_url, timeout=60) as http:
        assert http.get("/healthz").status_code == 200 and http.get("/metrics").status_code == 200  # anonymous
        created = http.post("/leases", json={}, headers=_headers("job-a"))
        assert created.status_code == 201 and created.json()["job"] == "a", created.text  # the token's own job
        lid = created.json()["id"]
        for method, path, kwargs in _lease_routes(lid):
            for who in ("none", "wrong"):
                got = http.request(method, path, headers=_headers(who), **kwargs)
                assert got.status_code == 401 and got.json()["error"]["code"] == "unauthorized", (who, path)
            other = http.request(method, path, headers=_headers("job-b"), **kwargs)
            assert other.status_code == 404 and other.json()["error"]["code"] == "lease_not_found", (path, other.text)
            for who in ("job-a", "service", "admin", "old-admin"):
                got = http.request(method, path, headers=_headers(who), **kwargs)
                assert got.status_code < 300, (who, method, path, got.text)
        assert http.delete(f"/leases/{lid}", headers=_headers("job-b")).status_code == 404
        assert http.get(f"/leases/{lid}", headers=_headers("job-a")).status_code == 200  # still there
        assert http.delete(f"/leases/{lid}", headers=_headers("job-a")).status_code == 204


def test_listing_creating_and_templates_by_role(broker_url: str) -> None:
    with httpx.Client(base_url=broker_url, timeout=60) as http:
        lid = http.post("/leases", json={"job": "a"}, headers=_headers("service")).json()["id"]
        try:
            assert [x["id"] for x in http.get("/leases", headers=_headers("job-a")).json()] == [lid]
            assert http.get("/leases", headers=_headers("job-b")).json() == []
            assert http.get("/leases", params={"job": "a"}, headers=_headers("job-b")).status_code == 403
            assert len(http.get("/leases", headers=_headers("service")).json()) == 1
            assert http.get("/leases", headers=_headers("none")).status_code == 401
            spoof = http.post("/leases", json={"job": "a"}, headers=_headers("job-b"))
            assert spoof.status_code == 403 and spoof.json()["error"]["code"] == "forbidden"
        finally:
            http.delete(f"/leases/{lid}", headers=_headers("admin"))
        template = {"name": "t1"}
        for who, status in (("none", 401), ("wrong", 401), ("job-a", 403), ("service", 403), ("admin", 201)):
            assert http.post("/templates", json=template, headers=_headers(who)).status_code == status, who
        assert http.get("/templates", headers=_headers("job-a")).status_code == 200
        assert http.get("/templates").status_code == 401
    _template_sources_stay_inside_the_roots(broker_url)
    _no_secret_in_health_metrics_or_errors(broker_url)


def _template_sources_stay_inside_the_roots(broker_url: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="tpl-", dir=tempfile.gettempdir()))
    (root / "ok").mkdir()
    os.symlink("/etc", root / "escape")  # inside a root, pointing out of it
    admin = _headers("admin")
    with httpx.Client(base_url=broker_url, timeout=60) as http:
        for rootfs in (str(root / "escape"), str(root / "missing"), "/etc", "etc", "/tmp/\0x"):
            bad = http.post("/templates", json={"name": "bad", "rootfs": rootfs}, headers=admin)
            assert bad.status_code in (400, 422) and bad.json()["error"]["field"] == "rootfs", (rootfs, bad.text)
        good = http.post("/templates", json={"name": "good", "rootfs": str(root / "ok" / ".")}, headers=admin)
        assert good.status_code == 201 and good.json()["rootfs"] == str(root / "ok")  # stored resolved
    for entry in (root / "escape", root / "ok", root):
        entry.unlink() if entry.is_symlink() else entry.rmdir()


def _no_secret_in_health_metrics_or_errors(broker_url: str) -> None:
    with httpx.Client(base_url=broker_url, timeout=60) as http:
        pages = [http.get("/healthz").text, http.get("/metrics").text,
                 http.get("/leases", headers=_headers("wrong")).text]  # fmt: skip
    for secret in (ADMIN, SERVICE, "tok-a", "not-a-token"):
        assert not any(secret in page for page in pages)


BAD_EXEC: list[dict[str, Any]] = [
    {"argv": ["ec\u0000ho"]},
    {"shell": "echo \u0000"},
    {"shell": "true", "env": {"A=B": "1"}},
    {"shell": "true", "env": {"A": "\u0000"}},
    {"shell": "true", "cwd": "/work\u0000space"},
    {"shell": "true", "timeout_s": 1e40},
    {"argv": []},
]


def test_bad_input_is_a_4xx_and_never_infra(broker_url: str) -> None:
    """NUL bytes, malformed env keys, huge or non-finite numbers, a directory as a file (issue 9)."""
    admin = _headers("admin")
    with httpx.Client(base_url=broker_url, timeout=60, headers=admin) as http:
        bad_leases: list[dict[str, Any]] = [
            {"resources": {"memory_mb": 1e40}},
            {"ttl_s": 1e300},
            {"labels": {"a": "\0"}},
        ]
        for lease_body in bad_leases:
            got = http.post("/leases", json=lease_body)
            assert got.status_code == 422 and got.json()["error"]["infra"] is False, (lease_body, got.text)
        infinite = http.post("/leases", content=b'{"ttl_s": Infinity}', headers={"Content-Type": "application/json"})
        assert infinite.status_code == 422, infinite.text
        lid = http.post("/leases", json={"job": "a"}).json()["id"]
        try:
            for body in BAD_EXEC:
                got = http.post(f"/leases/{lid}/exec", json=body)
                assert got.status_code == 422 and got.json()["error"]["infra"] is False, (body, got.text)
            assert http.post(f"/leases/{lid}/exec", json={"shell": "mkdir -p d"}).json()["exit_code"] == 0
            on_dir = http.put(f"/leases/{lid}/files", params={"path": "d"}, content=b"x")
            assert on_dir.status_code == 400 and on_dir.json()["error"]["field"] == "path", on_dir.text
            assert "/tmp" not in on_dir.text and "rollout-broker" not in on_dir.text  # no host path leaks
            for verb in ("PUT", "GET"):
                nul = http.request(verb, f"/leases/{lid}/files", params={"path": "a\u0000b"}, content=b"")
                assert nul.status_code == 422 and nul.json()["error"]["field"] == "path", nul.text
            assert http.get("/healthz").status_code == 200
            missing, wrong = http.get("/nope"), http.put("/leases")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
            assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "bad_request"
        finally:
            http.delete(f"/leases/{lid}")

"""The proxy's tokens and edges, attacked: the cross-job matrix over every admin route and the data
plane, and the malformed calls that used to reach an engine (issue 9)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.protocol import keys
from services.protocol import llm as h
from services.runtime.auth import hash_token
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.fleet import start_engines
from tests.support.processes import start_service

ADMIN, SERVICE = "p-admin", "p-service"
TOKENS = {"none": None, "wrong": "nope", "job-b": "tok-b", "job-a": "tok-a", "service": SERVICE, "admin": ADMIN}
CALL = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
MAX_BODY = 100_000


def _headers(who: str, **extra: str) -> dict[str, str]:
    token = TOKENS[who]
    return {**({"Authorization": f"Bearer {token}"} if token else {}), **extra}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, redis_server: EmbeddedRedis) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("proxy-auth") / "logs"
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.hset(keys.job_tokens(), mapping={hash_token("tok-a"): "a", hash_token("tok-b"): "b"})
    client.hset(keys.job_record("a"), mapping={"job": "a", "pool": "default"})
    client.hset(keys.job_record("b"), mapping={"job": "b", "pool": "other"})
    client.close()
    engines, urls = start_engines(logs, 2)
    env = {"ROLLOUT_REDIS_URL": redis_server.url, "ROLLOUT_PROXY_ADMIN_TOKEN": ADMIN,
           "ROLLOUT_PROXY_SERVICE_TOKEN": SERVICE, "ROLLOUT_PROXY_REQUIRE_TOKEN": "true",
           "ROLLOUT_PROXY_MAX_BODY_BYTES": str(MAX_BODY)}  # fmt: skip
    argv = ["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "1", "--engines", urls[0],
            "--pools", f"other={urls[1]}"]  # fmt: skip
    service = start_service(argv, log_dir=logs, env=env, name="proxy")
    try:
        yield service.url
    finally:
        service.stop()
        engines.stop()


def _admin_routes(weights: Path) -> list[tuple[str, str, object]]:
    """Every admin route, with a body whose effect is harmless (an unknown engine answers 404)."""
    ghost = {"url": "http://127.0.0.1:9"}
    return [
        ("GET", "/admin/status", None),
        ("POST", "/admin/engines", {"url": "http://127.0.0.1:9", "pool": "default", "bogus": 1}),
        ("POST", "/admin/engines/move", {**ghost, "pool": "default"}),
        ("POST", "/admin/engines/drain", ghost),
        ("POST", "/admin/engines/remove", ghost),
        ("POST", "/admin/weights", {"pool": "default", "version": "v1", "location": str(weights), "checksum": "x"}),
        ("POST", "/admin/lora", {"pool": "default", "action": "unload", "lora_name": "none-loaded"}),
    ]


def test_admin_matrix(proxy: str, tmp_path: Path) -> None:
    with httpx.Client(base_url=proxy, timeout=60) as http:
        for method, path, body in _admin_routes(tmp_path):
            for who, expected in (("none", 401), ("wrong", 401), ("service", 403), ("job-b", 403)):
                got = http.request(method, path, json=body, headers=_headers(who))
                assert got.status_code == expected and "error" in got.json(), (who, path, got.text)
            admin = http.request(method, path, json=body, headers=_headers("admin"))
            assert admin.status_code not in (401, 403, 500), (path, admin.text)
            owner = http.request(method, path, json=body, headers=_headers("job-a"))
            allowed = path in ("/admin/weights", "/admin/lora")  # job a's own pool only
            assert (owner.status_code not in (401, 403, 500)) if allowed else owner.status_code == 403, (path, owner)
        other_pool = {"pool": "other", "version": "v2", "location": str(tmp_path), "checksum": "x"}
        assert http.post("/admin/weights", json=other_pool, headers=_headers("job-a")).status_code == 403
        assert http.post("/admin/weights", json=other_pool, headers=_headers("job-b")).status_code == 200


def test_data_plane_needs_a_token_and_is_attributed(proxy: str) -> None:
    with httpx.Client(base_url=proxy, timeout=60) as http:
        for who in ("none", "wrong"):
            assert http.post("/generate", json=CALL, headers=_headers(who)).status_code == 401
        assert http.get("/v1/models").status_code == 401
        owner = http.post("/generate", json=CALL, headers=_headers("job-a"))
        assert owner.status_code == 200, owner.text
        served = http.post("/generate", json=CALL, headers=_headers("service", **{h.HEADER_JOB: "b"}))
        assert served.status_code == 200
        metrics = http.get("/metrics").text  # anonymous, like /healthz
        assert http.get("/healthz").status_code == 200 and http.get("/openapi.json").status_code == 200
    assert 'rollout_proxy_job_calls_total{job="a"}' in metrics and 'rollout_proxy_job_calls_total{job="b"}' in metrics
    assert not any(secret in metrics for secret in (ADMIN, SERVICE, "tok-a"))


@pytest.mark.parametrize(
    ("path", "body", "headers", "field"),
    [
        ("/generate", CALL, {h.HEADER_DEADLINE: "nan"}, h.HEADER_DEADLINE),
        ("/generate", CALL, {h.HEADER_DEADLINE: "inf"}, h.HEADER_DEADLINE),
        ("/generate", CALL, {h.HEADER_DEADLINE: "1e300"}, h.HEADER_DEADLINE),
        ("/generate", CALL, {h.HEADER_SESSION: "caf\u00e9".encode().decode("latin-1")}, h.HEADER_SESSION),
        ("/generate", {"input_ids": [1, -5]}, {}, "input_ids"),
        ("/generate", {"input_ids": "hi"}, {}, "input_ids"),
        ("/v1/chat/completions", {"model": "default", "messages": "hi"}, {}, "messages"),
        ("/v1/completions", {"model": "default", "prompt": {"a": 1}}, {}, "prompt"),
    ],
)
def test_malformed_calls_are_4xx_naming_the_field(
    proxy: str, path: str, body: object, headers: dict[str, str], field: str
) -> None:
    raw = [(k.encode(), v.encode("latin-1")) for k, v in {**_headers("admin"), **headers}.items()]
    got = httpx.post(proxy + path, json=body, headers=raw, timeout=60)
    assert got.status_code == 422, got.text  # validation_error
    assert got.json()["error"]["field"] == field and got.json()["error"]["infra"] is False


def test_unknown_paths_and_methods_answer_an_error_body(proxy: str) -> None:
    with httpx.Client(base_url=proxy, timeout=60) as http:
        missing = http.get("/nope", headers=_headers("admin"))
        wrong_method = http.get("/generate", headers=_headers("admin"))
        not_json = http.post("/generate", content=b"{nan", headers=_headers("admin"))
        too_large = http.post("/generate", json={**CALL, "input_ids": [7] * MAX_BODY}, headers=_headers("admin"))
        # ``Expect`` takes the application's route (its 100 Continue) instead of the data plane's own
        expecting = http.post("/generate", json=CALL, headers=_headers("admin", Expect="100-continue"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "bad_request"
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "bad_request"
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "payload_too_large"
    assert expecting.status_code == 200 and expecting.json()["meta_info"][h.META_ENGINE], expecting.text

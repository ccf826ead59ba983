"""Bad input at the rollout API's edge is the caller's 4xx naming the field, never a 5xx or a late
``infra_error`` (issue 9's findings, one regression each)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from services.runtime.redis_server import EmbeddedRedis
from tests.support.processes import ServiceProcess, start_service

ADMIN = "validation-admin"


@pytest.fixture(scope="module")
def api(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    logs = tmp_path_factory.mktemp("api-validation-logs")
    service = start_service(
        ["-m", "services.cli", "api", "--port", "{port}", "--redis-url", redis_server.url], log_dir=logs,
        env={"ROLLOUT_API_ADMIN_TOKEN": ADMIN}, name="api",
    )  # fmt: skip
    yield service
    service.stop()


@pytest.fixture
def job(api: ServiceProcess, redis_url: str) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    with httpx.Client(base_url=api.url, timeout=30.0) as http:
        made = http.post("/jobs", json={"job": "v"}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert made.status_code == 201, made.text
        yield http, {"Authorization": f"Bearer {made.json()['token']}", "Content-Type": "application/json"}


def _task(**over: Any) -> dict[str, Any]:
    return {"id": "t", "prompt": "p", "reward": {"command": "true"}, **over}


BAD = [
    ("NUL in the reward command", {"tasks": [_task(reward={"command": "tr\u0000ue"})]}, "tasks.0.reward.command"),
    ("NUL in a setup command", {"tasks": [_task(sandbox={"setup": ["a\u0000"]})]}, "tasks.0.sandbox.setup.0"),
    ("env key A=B", {"tasks": [_task(sandbox={"env": {"A=B": "1"}})]}, "tasks.0.sandbox.env.A=B.[key]"),
    ("NUL in an env value", {"tasks": [_task(sandbox={"env": {"A": "\u0000"}})]}, "tasks.0.sandbox.env.A"),
    ("NUL in a file path", {"tasks": [_task(sandbox={"files": {"a\u0000b": ""}})]}, "tasks.0.sandbox.files"),
    ("a directory as a file path", {"tasks": [_task(sandbox={"files": {"src/": ""}})]}, "tasks.0.sandbox.files"),
    ("a path that climbs out", {"tasks": [_task(reward={"command": "true", "files": {"../x": ""}})]}, "tasks.0"),
    ("1e40 memory", {"tasks": [_task(sandbox={"memory_mb": 1e40})]}, "tasks.0.sandbox.memory_mb"),
    ("1e300 wall clock", {"limits": {"wall_clock_s": 1e300}}, "limits.wall_clock_s"),
    ("group_size 1025", {"group_size": 1025}, "group_size"),
    ("temperature 1e40", {"sampling": {"temperature": 1e40}}, "sampling.temperature"),
    ("metadata integer past 2**64", {"tasks": [_task(metadata={"n": 10**20})]}, "tasks.0.metadata"),
    (
        "nested metadata integer under -2**63",
        {"tasks": [_task(metadata={"a": [{"b": -(2**63) - 1}]})]},
        "tasks.0.metadata",
    ),
    ("an integer as an env value", {"tasks": [_task(sandbox={"env": {"A": 10**20}})]}, "tasks.0.sandbox.env.A"),
    ("cpus 1e-9", {"tasks": [_task(sandbox={"cpus": 1e-9})]}, "tasks.0.sandbox.cpus"),
    ("cpus 5e-324", {"tasks": [_task(sandbox={"cpus": 5e-324})]}, "tasks.0.sandbox.cpus"),
]


@pytest.mark.parametrize(("what", "body", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_submission_is_422_naming_the_field(
    job: tuple[httpx.Client, dict[str, str]], what: str, body: dict[str, Any], field: str
) -> None:
    http, headers = job
    got = http.post("/rollouts", content=json.dumps({"job": "v", "tasks": [_task()], **body}), headers=headers)
    assert got.status_code == 422, (what, got.text)
    error = got.json()["error"]
    assert error["infra"] is False and (error["field"] or "").startswith(field), (what, error)


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_numbers_are_refused(job: tuple[httpx.Client, dict[str, str]], literal: str) -> None:
    """Python's JSON parser reads these literals; the contract refuses them (an inf limit once froze a rollout)."""
    http, headers = job
    for path in ('"limits": {"command_timeout_s": %s}', '"limits": {"wall_clock_s": %s}'):
        raw = '{"job": "v", "tasks": [{"id": "t", "prompt": "p", "reward": {"command": "true"}}], %s}' % (
            path % literal
        )
        got = http.post("/rollouts", content=raw, headers=headers)
        assert got.status_code == 422 and got.json()["error"]["field"].startswith("limits."), got.text


def test_swebench_image_name_that_makes_no_template_name(job: tuple[httpx.Client, dict[str, str]]) -> None:
    http, headers = job
    instance = {"instance_id": "i1", "repo": "r/r", "base_commit": "abc", "problem_statement": "fix it",
                "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [], "image_name": "__main__"}  # fmt: skip
    got = http.post("/rollouts/swebench", json={"job": "v", "instances": [instance]}, headers=headers)
    assert got.status_code == 202, got.text


def test_unknown_routes_and_methods_answer_an_error_body(job: tuple[httpx.Client, dict[str, str]]) -> None:
    http, headers = job
    missing, wrong = http.get("/nope", headers=headers), http.put("/rollouts", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405 and "error" in wrong.json()


def test_a_group_of_1024_stores_its_task_once(job: tuple[httpx.Client, dict[str, str]], redis_url: str) -> None:
    """0.1 MB with group_size 1024 once added ~100 MB to Redis (every item copied the task)."""
    http, headers = job
    body = json.dumps({"job": "v", "tasks": [_task(prompt="x" * 100_000)], "group_size": 1024}).encode()
    client = redis.Redis.from_url(redis_url)
    try:
        before = int(client.info("memory")["used_memory"])
        got = http.post("/rollouts", content=body, headers=headers)
        assert got.status_code == 202 and got.json()["trajectories"] == 1024, got.text
        added = int(client.info("memory")["used_memory"]) - before
    finally:
        client.close()
    # the task once (~body), then each item's ids, limits and stream entry (~2.5 KB, whatever the task's size)
    assert added < 2 * len(body) + 1024 * 4096, f"{added} bytes in Redis for a {len(body)}-byte request"


def test_cross_job_matrix_over_every_route(api: ServiceProcess, redis_url: str) -> None:
    """No token 401, a wrong token 401, another job's token 403, the owner's token 2xx, on every route."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=api.url, timeout=30.0) as http:
        tokens = {job: http.post("/jobs", json={"job": job}, headers=admin).json()["token"] for job in ("a", "b")}
        rollout = http.post("/rollouts", json={"job": "a", "tasks": [_task()], "group_size": 1},
                            headers={"Authorization": f"Bearer {tokens['a']}"}).json()["rollout_id"]  # fmt: skip
        swe = {"instance_id": "i1", "repo": "r/r", "base_commit": "abc", "problem_statement": "p",
               "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": []}  # fmt: skip
        routes: list[tuple[str, str, Any]] = [
            ("POST", "/rollouts", {"job": "a", "tasks": [_task()], "group_size": 1}),
            ("POST", "/rollouts/swebench", {"job": "a", "instances": [swe]}),
            ("GET", f"/rollouts/{rollout}", None),
            ("GET", "/jobs/a", None),
            ("GET", "/jobs/a/trajectories", None),
            ("DELETE", f"/rollouts/{rollout}", None),  # last: it cancels the rollout
        ]
        for method, path, body in routes:
            for who, token, expected in (("none", None, 401), ("wrong", "nope", 401), ("other", tokens["b"], 403)):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                got = http.request(method, path, json=body, headers=headers)
                assert got.status_code == expected and "error" in got.json(), (who, method, path, got.text)
            with http.stream(method, path, json=body, headers={"Authorization": f"Bearer {tokens['a']}"}) as owner:
                assert owner.status_code < 300, (method, path, owner.read())
        for token in (None, tokens["a"]):  # creating a job is the admin's
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            assert http.post("/jobs", json={"job": "c"}, headers=headers).status_code in (401, 403)

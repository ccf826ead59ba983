"""The rollout API as a real process against real Redis: tenancy, submission, bad input, quotas,
idempotency, cancellation of queued work, SSE resumption."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.protocol import Status, Task, WorkItem, from_stream_fields, keys
from services.runtime.redis_server import EmbeddedRedis
from tests.support.processes import ServiceProcess, start_service

ADMIN = "admin-secret"


@pytest.fixture(scope="module")
def api(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    logs = tmp_path_factory.mktemp("api-logs")
    env = {"ROLLOUT_API_ADMIN_TOKEN": ADMIN, "ROLLOUT_API_MAX_BODY_BYTES": "200000", "ROLLOUT_API_SSE_BLOCK_MS": "200"}
    service = start_service(
        ["-m", "services.cli", "api", "--port", "{port}", "--redis-url", redis_server.url], log_dir=logs, env=env,
        name="api",
    )  # fmt: skip
    yield service
    service.stop()


def stored_item(client: redis.Redis, job: str, raw: bytes) -> WorkItem:
    """A work entry with its task, which the rollout stores once (``keys.rollout_tasks``)."""
    rollout_id, task_id = WorkItem.task_ref(raw)
    task: Any = client.hget(keys.rollout_tasks(job, rollout_id), task_id)
    return WorkItem.decode(raw, Task.model_validate_json(task))


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def task(task_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": task_id, "prompt": "do it", "reward": {"command": "true"}, **extra}


def create_job(client: httpx.Client, job: str, **extra: Any) -> str:
    response = client.post("/jobs", json={"job": job, **extra}, headers=auth(ADMIN))
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


@pytest.fixture
def client(api: ServiceProcess, redis_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=10.0) as http:
        yield http


def test_tenancy(client: httpx.Client) -> None:
    token_a = create_job(client, "job-a")
    token_b = create_job(client, "job-b")
    body = {"job": "job-a", "tasks": [task("t1")], "group_size": 2}
    assert client.post("/jobs", json={"job": "x"}).status_code == 401
    assert client.post("/jobs", json={"job": "x"}, headers=auth("nope")).status_code == 401
    assert client.post("/jobs", json={"job": "x"}, headers=auth(token_a)).json()["error"]["code"] == "forbidden"
    assert client.post("/rollouts", json=body, headers=auth(token_b)).status_code == 403
    accepted = client.post("/rollouts", json=body, headers=auth(token_a))
    assert accepted.status_code == 202
    rollout = accepted.json()["rollout_id"]
    assert client.get(f"/rollouts/{rollout}", headers=auth(token_b)).status_code == 403
    assert client.delete(f"/rollouts/{rollout}", headers=auth(token_b)).status_code == 403
    assert client.get("/jobs/job-a", headers=auth(token_b)).status_code == 403
    assert client.get("/jobs/job-a/trajectories", headers=auth(token_b)).status_code == 403
    assert client.get(f"/rollouts/{rollout}", headers=auth(token_a)).status_code == 200
    assert client.get("/jobs/job-a", headers=auth(ADMIN)).status_code == 200
    assert client.post("/jobs", json={"job": "job-a"}, headers=auth(ADMIN)).status_code == 409


def test_submit_queues_every_item_before_answering_and_is_idempotent(
    client: httpx.Client, redis_client: redis.Redis
) -> None:
    token = create_job(client, "train")
    body = {"job": "train", "tasks": [task("a"), task("b"), task("c")], "group_size": 4, "idempotency_key": "k1"}
    first = client.post("/rollouts", json=body, headers=auth(token))
    assert first.status_code == 202
    answer = first.json()
    assert (answer["tasks"], answer["trajectories"], answer["duplicate"]) == (3, 12, False)
    entries: Any = redis_client.xrange(keys.work_stream("train"))
    items = [stored_item(redis_client, "train", fields[b"item"]) for _, fields in entries]
    assert len(items) == 12
    assert {(i.task.id, i.sample_index) for i in items} == {(t, s) for t in "abc" for s in range(4)}
    assert {i.rollout_id for i in items} == {answer["rollout_id"]}
    again = client.post("/rollouts", json=body, headers=auth(token))
    assert again.status_code == 202
    assert again.json() == {**answer, "duplicate": True}
    assert redis_client.xlen(keys.work_stream("train")) == 12
    plain = {**body, "idempotency_key": None}  # without a key, every submission is a new rollout
    ids = {client.post("/rollouts", json=plain, headers=auth(token)).json()["rollout_id"] for _ in range(2)}
    assert len(ids) == 2 and answer["rollout_id"] not in ids
    assert redis_client.xlen(keys.work_stream("train")) == 36
    status = client.get(f"/rollouts/{answer['rollout_id']}", headers=auth(token)).json()
    assert (status["total"], status["queued"], status["in_flight"], status["finished"]) == (12, 12, 0, 0)
    job = client.get("/jobs/train", headers=auth(token)).json()
    assert (job["queue_depth"], job["in_flight"], job["weight"]) == (36, 0, 1.0)


def test_bad_input(client: httpx.Client) -> None:
    token = create_job(client, "bad", quotas={"max_queued": 5})
    bad_task = {"id": "t", "prompt": "x"}  # no reward
    response = client.post("/rollouts", json={"job": "bad", "tasks": [bad_task]}, headers=auth(token))
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "tasks.0.reward"
    response = client.post("/rollouts", json={"job": "bad", "tasks": [task("t")], "group_size": 0}, headers=auth(token))
    assert (response.status_code, response.json()["error"]["field"]) == (422, "group_size")
    dup = client.post("/rollouts", json={"job": "bad", "tasks": [task("t"), task("t")]}, headers=auth(token))
    assert (dup.status_code, dup.json()["error"]["field"]) == (422, "tasks.1.id")
    huge = {"job": "bad", "tasks": [task("t", prompt="x" * 300_000)]}
    response = client.post("/rollouts", json=huge, headers=auth(token))
    assert (response.status_code, response.json()["error"]["code"]) == (413, "payload_too_large")
    over = client.post("/rollouts", json={"job": "bad", "tasks": [task("t")], "group_size": 8}, headers=auth(token))
    assert (over.status_code, over.json()["error"]["code"]) == (429, "quota_exceeded")
    assert client.post("/rollouts", json={"job": "bad", "tasks": [task("t")], "group_size": 5}, headers=auth(token))
    assert client.post("/rollouts", json={"job": "nojob", "tasks": [task("t")]}, headers=auth(ADMIN)).status_code == 404
    assert client.get("/rollouts/bad.0000", headers=auth(token)).status_code == 404


def read_sse(client: httpx.Client, path: str, headers: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    event_id = ""
    with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                events.append((event_id, json.loads(line[6:])))
    return events


def test_cancel_drops_queued_items_and_sse_resumes(client: httpx.Client, redis_client: redis.Redis) -> None:
    token = create_job(client, "cx")
    body = {"job": "cx", "tasks": [task("a"), task("b")], "group_size": 3}
    rollout = client.post("/rollouts", json=body, headers=auth(token)).json()["rollout_id"]
    status = client.delete(f"/rollouts/{rollout}", headers=auth(token)).json()
    assert status["cancelled"] is True
    assert (status["queued"], status["finished"], status["by_status"]["cancelled"]) == (0, 6, 6)
    assert redis_client.xlen(keys.work_stream("cx")) == 0
    stream: Any = redis_client.xrange(keys.trajectory_stream("cx"))
    trajectories = [from_stream_fields(fields) for _, fields in stream]
    assert {t.status for t in trajectories} == {Status.CANCELLED}
    assert len({t.trajectory_id for t in trajectories}) == 6
    assert client.delete(f"/rollouts/{rollout}", headers=auth(token)).json()["finished"] == 6  # idempotent

    first = read_sse(client, "/jobs/cx/trajectories?limit=2", auth(token))
    assert [e[1]["trajectory_id"] for e in first] == [t.trajectory_id for t in trajectories[:2]]
    rest = read_sse(client, "/jobs/cx/trajectories?limit=4", {**auth(token), "Last-Event-ID": first[-1][0]})
    assert [e[1]["trajectory_id"] for e in rest] == [t.trajectory_id for t in trajectories[2:]]
    assert rest[0][1]["status"] == "cancelled"


BAD_EVENT_IDS = ["18446744073709551616-0", "1-18446744073709551616", "abc", "1-2-3", "-1", "1-", "\u00b2", "1" * 21]


def test_a_malformed_resume_point_is_400_naming_it(client: httpx.Client) -> None:
    """An id past 2**64 used to answer 200 and close the stream at once (issue 29)."""
    token = create_job(client, "sse-ids")
    for bad in BAD_EVENT_IDS:
        ways: list[tuple[dict[str, str], dict[str, str], str]] = [({}, {"after": bad}, "after")]
        if bad.isascii():  # a header carries ASCII alone
            ways.append(({"Last-Event-ID": bad}, {}, "Last-Event-ID"))
        for headers, params, field in ways:
            got = client.get("/jobs/sse-ids/trajectories", headers={**auth(token), **headers}, params=params)
            assert got.status_code == 400, (bad, got.text)
            assert got.json()["error"]["code"] == "bad_request" and got.json()["error"]["field"] == field, got.text
    for good in ("18446744073709551615-18446744073709551615", "0", "$"):
        with client.stream("GET", "/jobs/sse-ids/trajectories", headers={**auth(token), "Last-Event-ID": good}) as ok:
            assert ok.status_code == 200 and next(ok.iter_lines()) == "retry: 1000", good


def test_health_and_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    client.get("/jobs/zzz", headers=auth(ADMIN))
    text = client.get("/metrics").text
    assert "rollout_api_requests_total" in text


def test_swebench_instances_become_tasks(client: httpx.Client, redis_client: redis.Redis, tmp_path: Path) -> None:
    token = create_job(client, "swe")
    instance = {
        "instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "base_commit": "d16bfe05a7",
        "problem_statement": "separability matrix is wrong", "FAIL_TO_PASS": '["tests/test_sep.py::test_a"]',
        "PASS_TO_PASS": "[]", "image_name": "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        "test_patch": "diff --git a/tests/test_sep.py b/tests/test_sep.py\n", "version": "4.3",
    }  # fmt: skip
    body = {"job": "swe", "instances": [instance], "group_size": 2, "template": "default"}
    response = client.post("/rollouts/swebench", json=body, headers=auth(token))
    assert response.status_code == 202, response.text
    entries: Any = redis_client.xrange(keys.work_stream("swe"))
    items = [stored_item(redis_client, "swe", f[b"item"]) for _, f in entries]
    assert len(items) == 2
    item_task = items[0].task
    assert item_task.id == "astropy__astropy-12907"
    assert item_task.reward.command == "python -m pytest -rA tests/test_sep.py"
    assert item_task.reward.restore == ["tests/test_sep.py"] and "git apply" in item_task.reward.setup[0]
    assert item_task.metadata["FAIL_TO_PASS"] == ["tests/test_sep.py::test_a"]


def test_a_job_gone_while_followed_ends_its_stream(client: httpx.Client, redis_client: redis.Redis) -> None:
    """A store that lost its state takes the job with it: the follower gets one error event
    (``unknown_job``), not keep-alives forever (issue 29)."""
    token = create_job(client, "sse-gone")
    with client.stream("GET", "/jobs/sse-gone/trajectories", headers=auth(token)) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "retry: 1000"  # the job was there when the stream started
        redis_client.delete(keys.job_record("sse-gone"))  # as a Redis restarted empty would have it
        rest = []
        for line in lines:  # the server closes the stream (bounded: the old code sent keep-alives forever)
            rest.append(line)
            if len(rest) > 100:
                break
    assert "event: error" in rest, rest
    data = json.loads(rest[rest.index("event: error") + 1].removeprefix("data: "))
    assert data["error"]["code"] == "unknown_job" and data["error"]["field"] == "job"

"""The dashboard's routes on a real API process and a real Redis: tenancy, the viewer's filters and
cursor, one trajectory with its token texts, JSON-lines download, the sampled history."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import redis

from services.protocol import Cap, Status, Trajectory, keys, to_stream_fields, trajectory_from_json
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tokenizer import write_tokenizer_dir
from tests.support.processes import ServiceProcess, start_service
from tests.trainer.factories import make_trajectory

ADMIN = "dash-admin"


@pytest.fixture(scope="module")
def api(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("dash-api")
    model = write_tokenizer_dir(root / "model")
    env = {
        "ROLLOUT_API_ADMIN_TOKEN": ADMIN,
        "ROLLOUT_API_DASHBOARD_SAMPLE_S": "0.2",
        "ROLLOUT_API_DASHBOARD_CACHE_S": "0",
    }
    service = start_service(
        ["-m", "services.cli", "api", "--port", "{port}", "--redis-url", redis_server.url, "--tokenizer-path",
         str(model)], log_dir=root, env=env, name="api",
    )  # fmt: skip
    yield service
    service.stop()


@pytest.fixture
def client(api: ServiceProcess, redis_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=10.0) as http:
        yield http


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_job(client: httpx.Client, job: str) -> dict[str, str]:
    response = client.post("/jobs", json={"job": job}, headers=auth(ADMIN))
    assert response.status_code == 201, response.text
    return auth(response.json()["token"])


def publish(redis_client: redis.Redis, trajectories: list[Trajectory]) -> list[str]:
    ids = []
    for traj in trajectories:
        fields: Any = to_stream_fields(traj)
        entry: Any = redis_client.xadd(keys.trajectory_stream(traj.job), fields)
        ids.append(entry.decode())
    return ids


def varied(job: str) -> list[Trajectory]:
    """Twelve trajectories: rewards 0/1, versions 0..2, two rollouts, one truncated, one infra error."""
    out = []
    for i in range(12):
        status = Status.INFRA_ERROR if i == 7 else Status.COMPLETED
        traj = make_trajectory(f"t{i}", i, reward=float(i % 2), status=status, version=str(i % 3), job=job, seed=i)
        traj = msgspec.structs.replace(traj, rollout_id=f"{job}.r{i % 2}", trajectory_id=f"{job}.r{i % 2}:t{i}:0")
        if i == 4:
            traj = msgspec.structs.replace(traj, status=Status.TRUNCATED, truncation=Cap.TURNS)
        out.append(traj)
    return out


def test_tenancy_and_the_page(client: httpx.Client) -> None:
    a, b = new_job(client, "job-a"), new_job(client, "job-b")
    assert client.get("/ui/api/overview").status_code == 401
    assert client.get("/ui/api/overview", headers=auth("nope")).json()["error"]["code"] == "unauthorized"
    assert [j["status"]["job"] for j in client.get("/ui/api/overview", headers=a).json()["jobs"]] == ["job-a"]
    everything = client.get("/ui/api/overview", headers=auth(ADMIN)).json()
    assert everything["admin"] and [j["status"]["job"] for j in everything["jobs"]] == ["job-a", "job-b"]
    assert everything["jobs"][0]["status"] == client.get("/jobs/job-a", headers=a).json()
    for path in ("/ui/api/trajectories?job=job-b", "/ui/api/history?job=job-b", "/ui/api/trajectories.jsonl?job=job-b",
                 "/ui/api/trajectories/job-b/1-0"):  # fmt: skip
        assert client.get(path, headers=a).status_code == 403, path
    assert client.get("/ui/api/trajectories?job=nojob", headers=auth(ADMIN)).status_code == 404
    assert client.get("/ui/api/trajectories?job=job-b&min_reward=nan", headers=b).status_code == 422
    page = client.get("/ui/")
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    assert client.get("/ui/static/vendor/uPlot.iife.min.js").status_code == 200
    assert client.get("/ui/static/vendor/uPlot.LICENSE").text.startswith("The MIT License")


def test_filters_cursor_detail_and_download(client: httpx.Client, redis_client: redis.Redis) -> None:
    headers = new_job(client, "view")
    trajectories = varied("view")
    entry_ids = publish(redis_client, trajectories)

    def listing(**params: Any) -> dict[str, Any]:
        response = client.get("/ui/api/trajectories", params={"job": "view", **params}, headers=headers)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    assert [r["entry_id"] for r in listing()["items"]] == entry_ids[::-1]
    assert [r["task_id"] for r in listing(status="truncated", cap="turns")["items"]] == ["t4"]
    assert {r["task_id"] for r in listing(weight_version="2")["items"]} == {"t2", "t5", "t8", "t11"}
    assert {r["task_id"] for r in listing(min_reward=1, rollout="view.r1")["items"]} == {
        f"t{i}" for i in (1, 3, 5, 9, 11)
    }  # t7 is odd but an infra error: it has no reward to filter on
    infra = listing(status="infra_error")["items"]
    assert infra[0]["reward"] is None and infra[0]["infra_stage"] == "sandbox_exec"
    first = listing(limit=5)
    second = listing(limit=5, before=first["next"])
    third = listing(limit=5, before=second["next"])
    paged = [r["entry_id"] for page in (first, second, third) for r in page["items"]]
    assert paged == entry_ids[::-1] and third["next"] is None

    detail = client.get(f"/ui/api/trajectories/view/{entry_ids[0]}", headers=headers).json()
    traj = trajectory_from_json(msgspec.json.encode(detail["trajectory"]))
    assert traj.key == trajectories[0].key and traj.response_ids == trajectories[0].response_ids
    assert len(detail["token_texts"]) == len(traj.response_ids) and detail["prompt_text"]
    assert client.get("/ui/api/trajectories/view/1-0", headers=headers).json()["error"]["code"] == "not_found"
    assert client.get("/ui/api/trajectories/view/abc", headers=headers).status_code == 400

    lines = client.get("/ui/api/trajectories.jsonl", params={"job": "view", "status": "completed"}, headers=headers)
    got = [trajectory_from_json(line) for line in lines.text.splitlines()]
    assert [t.key for t in got] == [t.key for t in trajectories[::-1] if t.status is Status.COMPLETED]


def test_history_is_sampled(client: httpx.Client) -> None:
    headers = new_job(client, "hist")

    def samples() -> Any:
        body = client.get("/ui/api/history", params={"job": "hist"}, headers=headers).json()
        return body if len(body["job"]) >= 2 and body["fleet"] else None

    from tests.rollout_api.fleet import wait_for

    history = wait_for("two samples", samples, timeout_s=30)
    assert all(s["finished"] == 0 and s["queue_depth"] == 0 for s in history["job"])
    assert history["job"][0]["t"] < history["job"][-1]["t"]


def test_jobs_without_a_stream_or_trainer(client: httpx.Client, redis_client: redis.Redis, tmp_path: Path) -> None:
    headers = new_job(client, "fresh")
    view = client.get("/ui/api/overview", headers=headers).json()["jobs"][0]
    assert view["weight_versions"] == {} and view["staleness"] is None and view["trainer_lag"] is None
    publish(redis_client, varied("fresh")[:3])
    redis_client.xgroup_create(keys.trajectory_stream("fresh"), keys.TRAINERS_GROUP, id="0")
    redis_client.xreadgroup(keys.TRAINERS_GROUP, "t", {keys.trajectory_stream("fresh"): ">"}, count=2)
    view = client.get("/ui/api/overview", headers=headers).json()["jobs"][0]
    assert view["trainer_lag"] == 1 and view["weight_versions"] == {"0": 2, "1": 2, "2": 2}
    assert view["staleness"]["sampled"] == 0  # no proxy: the pool's version is unknown

"""End to end with real processes: Redis, scripted SGLang-compatible engines behind the real LLM
proxy, the real sandbox broker with local (bubblewrap) sandboxes, the rollout API and workers."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from services.protocol import Cap, Status, keys
from services.rollout_api.worker.tokenization import ChatTokenizer
from tests.rollout_api.fleet import (
    ADMIN,
    SUBMIT,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    sse_trajectories,
    submit,
    task,
    trajectories,
    wait_finished,
    wait_for,
)
from tests.sandbox_broker.dockerd import runsc_problem

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pytest.importorskip("services.llm_proxy", reason="the LLM proxy (branch proxy) has not landed")
pytest.importorskip("services.sandbox_broker", reason="the sandbox broker (branch broker) has not landed")

SLOW_STEP = {"text": "```bash\nls\n```", "latency_s": 1.0}
RULES: dict[str, list[Any]] = {
    "TASK-SOLVE": ["THOUGHT: write it\n```bash\necho 42 > answer.txt\n```", f"THOUGHT: done\n{SUBMIT}"],
    "TASK-WRONG": ["```bash\necho 41 > answer.txt\n```", SUBMIT],
    "TASK-FORMAT": [
        "no block at all",
        "two\n```bash\nls\n```\n```bash\npwd\n```",
        "```bash\necho 42 > answer.txt\n```",
        SUBMIT,
    ],  # fmt: skip
    "TASK-LOOP": ["```bash\nls\n```"],
    "TASK-LONG": ["x" * 400],
    "TASK-SLOWLLM": [{"text": "```bash\nls\n```", "latency_s": 3.0}],
    "TASK-SLOWCMD": ["```bash\nsleep 5\n```"],
    "TASK-SANDBOX": ["```bash\nsleep 2\n```", "```bash\necho 42 > answer.txt\n```", SUBMIT],
    "TASK-SLOWSTEP": [SLOW_STEP],
    "TASK-CRASH": [
        {"text": "```bash\nls\n```", "latency_s": 0.7},
        {"text": "```bash\necho 42 > answer.txt\n```", "latency_s": 0.7},
        {"text": SUBMIT, "latency_s": 0.7},
    ],  # fmt: skip
    "TASK-QUICK": [{"text": SUBMIT, "latency_s": 0.05}],
    "TASK-GVISOR": ['```bash\n[ "$(uname -r)" = 4.4.0 ] && echo 42 > answer.txt\n```', SUBMIT],  # gVisor's kernel
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet"), RULES, "e2e") as fleet:
        fleet.start_worker(jobs=["batch", "caps", "llmfail", "sandboxkill", "gvisor"], concurrency=16)
        yield fleet


@pytest.fixture
def client(fleet: Fleet) -> Iterator[httpx.Client]:
    with fleet.client() as http:
        yield http


@pytest.fixture(scope="module")
def tokenizer(fleet: Fleet) -> ChatTokenizer:
    return ChatTokenizer.from_dir(fleet.model_path)


def test_group_of_four_over_several_tasks(fleet: Fleet, client: httpx.Client, tokenizer: ChatTokenizer) -> None:
    headers = create_job(client, "batch")
    tasks = [
        task("solve-1", "TASK-SOLVE first", sandbox={"setup": ["sleep 1 && echo seeded > seed.txt"]}),
        task("solve-2", "TASK-SOLVE second"),
        task("wrong", "TASK-WRONG"), task("format", "TASK-FORMAT"),
    ]  # fmt: skip
    rollout = submit(client, headers, {"job": "batch", "tasks": tasks, "group_size": 4, "limits": {"max_turns": 10}})
    status = wait_finished(client, headers, rollout)
    assert status["by_status"] == {"completed": 16, "truncated": 0, "infra_error": 0, "cancelled": 0}
    found = trajectories(fleet.redis_url, "batch")
    assert len(found) == 16
    assert Counter(t.task_id for t in found) == {"solve-1": 4, "solve-2": 4, "wrong": 4, "format": 4}
    assert len({t.trajectory_id for t in found}) == 16
    for traj in found:
        assert traj.reward == (0.0 if traj.task_id == "wrong" else 1.0), traj.reward_details
        assert traj.status is Status.COMPLETED and traj.attempt == 1
        check_tokens(traj, tokenizer)
    assert {len(t.turns) for t in found if t.task_id == "format"} == {4}
    seeded = [t.timings for t in found if t.task_id == "solve-1"]  # the group's setup ran once (sandbox fork)
    assert sorted(t.setup_shared for t in seeded) == [False, True, True, True]
    # one `sleep 1` in all, not four: four runs would sum to 4 s or more, whatever the machine's load
    assert 1.0 <= sum(t.setup_s for t in seeded) < 4.0, seeded
    assert all(t.weight_versions == ["default"] * len(t.turns) for t in found)
    job = client.get("/jobs/batch", headers=headers).json()
    assert (job["finished"], job["in_flight"], job["queue_depth"]) == (16, 0, 0)
    assert job["tail"]["episode_p50_s"] is not None
    over_http = sse_trajectories(client, "/jobs/batch/trajectories?limit=16", headers)
    assert [t.key for t in over_http] == [t.key for t in found]
    assert all(a.response_ids == b.response_ids and a.response_logprobs == b.response_logprobs
               and a.loss_mask == b.loss_mask for a, b in zip(over_http, found, strict=True))  # fmt: skip


def check_tokens(traj: Any, tokenizer: ChatTokenizer) -> None:
    """The worker's token sequence is exactly the chat template over the readable conversation;
    the mask is 1 on generated tokens only, with the engine's logprobs there and 0.0 elsewhere."""
    traj.check()
    messages = [{"role": m.role, "content": m.content} for m in traj.messages]
    whole = tokenizer.encode(tokenizer.render(messages, False))
    assert list(traj.prompt_ids) + list(traj.response_ids) + tokenizer.encode(tokenizer.after_eos) == whole
    generated = 0
    for turn in traj.turns:
        span = slice(turn.response_offset, turn.response_offset + turn.response_tokens)
        assert set(traj.loss_mask[span]) == {1}
        assert traj.response_ids[span][-1] == tokenizer.eos_id
        generated += turn.response_tokens
    assert sum(traj.loss_mask) == generated
    assert all(lp == 0.0 for lp, m in zip(traj.response_logprobs, traj.loss_mask, strict=True) if m == 0)


def test_every_cap_truncates_with_its_name(fleet: Fleet, client: httpx.Client) -> None:
    headers = create_job(client, "caps")
    cases: dict[Cap, tuple[str, dict[str, Any]]] = {
        Cap.TURNS: ("TASK-LOOP", {"max_turns": 3}),
        Cap.TURN_TOKENS: ("TASK-LONG", {"max_tokens_per_turn": 50}),
        Cap.TRAJECTORY_TOKENS: ("TASK-LOOP", {"max_trajectory_tokens": 1100}),
        Cap.CONTEXT_LENGTH: ("TASK-LOOP " + "y" * 4200, {}),
        Cap.WALL_CLOCK: ("TASK-SLOWLLM", {"wall_clock_s": 1.0}),
        Cap.COMMAND_TIMEOUT: ("TASK-SLOWCMD", {"command_timeout_s": 0.5}),
    }
    rollouts = {
        cap: submit(client, headers, {"job": "caps", "tasks": [task(cap.value, prompt)], "group_size": 1,
                                      "limits": {"max_turns": 30, **limits}})
        for cap, (prompt, limits) in cases.items()
    }  # fmt: skip
    for rollout in rollouts.values():
        wait_finished(client, headers, rollout)
    found = {t.task_id: t for t in trajectories(fleet.redis_url, "caps")}
    assert {name: (t.status, t.truncation) for name, t in found.items()} == {
        cap.value: (Status.TRUNCATED, cap) for cap in cases
    }
    assert len(found[Cap.TURNS.value].turns) == 3
    assert found[Cap.TRAJECTORY_TOKENS.value].total_tokens <= 1100
    job = client.get("/jobs/caps", headers=headers).json()
    assert job["tail"]["turn_cap_hit_rate"] == pytest.approx(1 / 6)


def test_unknown_template_is_refused(client: httpx.Client) -> None:
    headers = create_job(client, "tmpl")
    body = {"job": "tmpl", "tasks": [task("t", "x", sandbox={"template": "no-such-template"})]}
    response = client.post("/rollouts", json=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "unknown_template", "message": "the broker has no template 'no-such-template'", "infra": False,
        "field": "tasks.0.sandbox.template", "retry_after_s": None,
    }  # fmt: skip


def test_a_task_can_ask_for_gvisor(fleet: Fleet, client: httpx.Client) -> None:
    """``sandbox.isolation: "gvisor"``: the episode's commands and its reward run in gVisor (the task
    scores 1 only where ``uname -r`` is gVisor's); an unknown level is refused at submission."""
    if problem := runsc_problem():
        pytest.skip(problem)
    headers = create_job(client, "gvisor")
    bad = client.post("/rollouts", json={"job": "gvisor", "tasks": [task("v", "x", sandbox={"isolation": "vm"})]},
                      headers=headers)  # fmt: skip
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "tasks.0.sandbox.isolation", bad.text
    tasks = [task("gv", "TASK-GVISOR", sandbox={"isolation": "gvisor"}), task("ns", "TASK-GVISOR")]
    rollout = submit(client, headers, {"job": "gvisor", "tasks": tasks, "group_size": 1, "limits": {"max_turns": 4}})
    assert wait_finished(client, headers, rollout)["by_status"]["completed"] == 2
    rewards = {t.task_id: t.reward for t in trajectories(fleet.redis_url, "gvisor")}
    assert rewards == {"gv": 1.0, "ns": 0.0}


def test_engine_killed_mid_episode_is_an_infra_error(fleet: Fleet, client: httpx.Client) -> None:
    headers = create_job(client, "llmfail", pool="llmfail")
    body = {"job": "llmfail", "tasks": [task("t", "TASK-SLOWSTEP")], "group_size": 2, "max_attempts": 2}
    rollout = submit(client, headers, body)
    wait_for("episodes to run", lambda: client.get(f"/rollouts/{rollout}", headers=headers).json()["in_flight"] == 2)
    fleet.engines["llmfail"].kill(signal.SIGKILL)
    wait_finished(client, headers, rollout)
    found = trajectories(fleet.redis_url, "llmfail")
    assert [t.status for t in found] == [Status.INFRA_ERROR] * 2
    for traj in found:
        assert traj.infra is not None and traj.infra.stage.value in ("llm", "llm_timeout")
        assert (traj.infra.attempts, traj.attempt) == (2, 2)
        assert not traj.status.trainable
    job = client.get("/jobs/llmfail", headers=headers).json()
    attempts, given_up = job["infra_failed_attempts_by_stage"], job["infra_error_trajectories_by_stage"]
    assert attempts["llm"] + attempts["llm_timeout"] == 4  # every failed attempt, retried or not
    assert given_up["llm"] + given_up["llm_timeout"] == 2  # the trajectories given up
    assert job["infra_error_rate"] == 1.0


def kill_sandbox_of(fleet: Fleet, job: str) -> None:
    with httpx.Client(base_url=fleet.broker.url, timeout=10.0, headers=bearer(ADMIN)) as broker:
        leases = wait_for(f"a sandbox of {job}", lambda: broker.get("/leases", params={"job": job}).json())
        assert broker.delete(f"/leases/{leases[0]['id']}").status_code in (200, 204)


def test_sandbox_killed_mid_episode_is_retried_then_infra_error(fleet: Fleet, client: httpx.Client) -> None:
    headers = create_job(client, "sandboxkill")
    body = {"job": "sandboxkill", "tasks": [task("retried", "TASK-SANDBOX")], "group_size": 1, "max_attempts": 2}
    retried = submit(client, headers, body)
    kill_sandbox_of(fleet, "sandboxkill")
    wait_finished(client, headers, retried)
    body = {**body, "tasks": [task("failed", "TASK-SANDBOX")], "max_attempts": 1}
    failed = submit(client, headers, body)
    wait_for("the retry's sandbox", lambda: client.get(f"/rollouts/{failed}", headers=headers).json()["in_flight"])
    kill_sandbox_of(fleet, "sandboxkill")
    wait_finished(client, headers, failed)
    found = {t.task_id: t for t in trajectories(fleet.redis_url, "sandboxkill")}
    ok, bad = found["retried"], found["failed"]
    assert (ok.status, ok.attempt, ok.reward) == (Status.COMPLETED, 2, 1.0)
    assert bad.status is Status.INFRA_ERROR and bad.infra is not None
    assert bad.infra.stage.value in ("sandbox_exec", "broker")


def test_worker_killed_mid_episode_loses_nothing(fleet: Fleet, client: httpx.Client) -> None:
    headers = create_job(client, "crash")
    doomed = fleet.start_worker(jobs=["crash"], concurrency=4)
    tasks = [task("a", "TASK-CRASH a"), task("b", "TASK-CRASH b")]
    rollout = submit(client, headers, {"job": "crash", "tasks": tasks, "group_size": 2})
    wait_for("episodes to run", lambda: client.get(f"/rollouts/{rollout}", headers=headers).json()["in_flight"] == 4)
    doomed.kill(signal.SIGKILL)
    fleet.start_worker(jobs=["crash"], concurrency=4)
    wait_finished(client, headers, rollout)
    found = trajectories(fleet.redis_url, "crash")
    assert sorted((t.task_id, t.sample_index) for t in found) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert {(t.status, t.reward, t.attempt) for t in found} == {(Status.COMPLETED, 1.0, 2)}


def test_cancel_stops_running_and_drops_queued(fleet: Fleet, client: httpx.Client) -> None:
    headers = create_job(client, "cancel")
    fleet.start_worker(jobs=["cancel"], concurrency=2)
    body = {"job": "cancel", "tasks": [task("t", "TASK-SLOWSTEP")], "group_size": 6, "limits": {"max_turns": 50}}
    rollout = submit(client, headers, body)
    wait_for("episodes to run", lambda: client.get(f"/rollouts/{rollout}", headers=headers).json()["in_flight"] == 2)
    answer = client.delete(f"/rollouts/{rollout}", headers=headers).json()
    assert (answer["cancelled"], answer["queued"]) == (True, 0)
    wait_finished(client, headers, rollout)
    assert [t.status for t in trajectories(fleet.redis_url, "cancel")] == [Status.CANCELLED] * 6
    with httpx.Client(base_url=fleet.broker.url, timeout=10.0, headers=bearer(ADMIN)) as broker:
        wait_for("sandboxes released", lambda: broker.get("/leases", params={"job": "cancel"}).json() == [])


def test_two_jobs_share_workers_by_weight(fleet: Fleet, client: httpx.Client) -> None:
    light = create_job(client, "fair-a", weight=1)
    heavy = create_job(client, "fair-b", weight=3)
    for job, headers in (("fair-a", light), ("fair-b", heavy)):
        submit(client, headers, {"job": job, "tasks": [task("q", "TASK-QUICK", answer_check=False)], "group_size": 40})
    fleet.start_worker(jobs=["fair-a", "fair-b"], concurrency=4)

    def finished() -> bool:
        pairs = (("fair-a", light), ("fair-b", heavy))
        return sum(int(client.get(f"/jobs/{j}", headers=h).json()["finished"]) for j, h in pairs) >= 40

    wait_for("40 trajectories", finished)
    both = trajectories(fleet.redis_url, "fair-a") + trajectories(fleet.redis_url, "fair-b")
    first = Counter(t.job for t in sorted(both, key=lambda t: t.started_at)[:32])
    assert 6 <= first["fair-a"] <= 10, first


def test_live_long_episodes_are_not_reclaimed(fleet: Fleet, client: httpx.Client) -> None:
    """Episodes that outlive the reclaim idle time (3 s here) stay with their live worker: the
    heartbeat keeps their entries fresh, so a second worker on the job never steals them."""
    headers = create_job(client, "longrun")
    fleet.start_worker(jobs=["longrun"], concurrency=2)
    fleet.start_worker(jobs=["longrun"], concurrency=2)
    body = {"job": "longrun", "tasks": [task("t", "TASK-SLOWSTEP")], "group_size": 4, "limits": {"max_turns": 5}}
    rollout = submit(client, headers, body)
    wait_finished(client, headers, rollout)
    found = trajectories(fleet.redis_url, "longrun")
    assert all(t.timings.total_s > 4.0 for t in found)
    assert {(t.status, t.truncation, t.attempt) for t in found} == {(Status.TRUNCATED, Cap.TURNS, 1)}


def test_graceful_shutdown_hands_episodes_back(fleet: Fleet, client: httpx.Client) -> None:
    """SIGTERM: running episodes get the grace period (2 s here), then their sandboxes are released
    and their items handed back; another worker finishes them as the same attempt."""
    headers = create_job(client, "drain")
    leaving = fleet.start_worker(jobs=["drain"], concurrency=2)
    body = {"job": "drain", "tasks": [task("t", "TASK-SLOWSTEP")], "group_size": 2, "limits": {"max_turns": 6}}
    rollout = submit(client, headers, body)
    wait_for("episodes to run", lambda: client.get(f"/rollouts/{rollout}", headers=headers).json()["in_flight"] == 2)
    leaving.stop(timeout_s=60)  # SIGTERM; a loaded machine may need more than the default 10 s
    with httpx.Client(base_url=fleet.broker.url, timeout=10.0, headers=bearer(ADMIN)) as broker:
        assert broker.get("/leases", params={"job": "drain"}).json() == []
    status = client.get(f"/rollouts/{rollout}", headers=headers).json()
    assert (status["queued"], status["in_flight"], status["finished"]) == (2, 0, 0)
    fleet.start_worker(jobs=["drain"], concurrency=2)
    wait_finished(client, headers, rollout)
    found = trajectories(fleet.redis_url, "drain")
    assert {(t.status, t.truncation, t.attempt) for t in found} == {(Status.TRUNCATED, Cap.TURNS, 1)}
    job = client.get("/jobs/drain", headers=headers).json()
    assert (job["queue_depth"], job["in_flight"], job["finished"]) == (0, 0, 2)


def test_an_undecodable_item_goes_to_the_dead_letters(fleet: Fleet, client: httpx.Client) -> None:
    """Never retried forever, never blocking: the rollout queued after it finishes (issue 9)."""
    headers = create_job(client, "dead")
    raw = redis.Redis.from_url(fleet.redis_url)
    try:
        raw.xadd(keys.work_stream("dead"), {"item": b'{"limits": {"wall_clock_s": null}}', "rollout": b"x"})
        fleet.start_worker(jobs=["dead"], concurrency=2)
        rollout = submit(client, headers, {"job": "dead", "tasks": [task("q", "TASK-QUICK")], "group_size": 1})
        wait_finished(client, headers, rollout)
        dead: Any = raw.xrange(keys.dead_letters("dead"))
    finally:
        raw.close()
    assert len(dead) == 1 and dead[0][1][b"dead_reason"] == b"undecodable" and b"task" in dead[0][1][b"dead_error"]
    assert [t.status for t in trajectories(fleet.redis_url, "dead")] == [Status.COMPLETED]

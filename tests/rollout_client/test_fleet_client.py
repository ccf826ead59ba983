"""``rollout_client`` against a fleet of real processes (Redis, scripted engines, the proxy, the
broker with local sandboxes, the API, a worker): a job created, tasks submitted and followed, the
job's figures, trajectories over SSE and through the consumer group (exactly once), weights posted
through the proxy's transaction and served, every error typed after its code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout_client import (
    AsyncRolloutClient,
    BadRequest,
    NotFound,
    RolloutClient,
    TrajectoryConsumer,
    Unauthorized,
    WeightPublisher,
    seal,
)
from services.protocol import Status
from services.protocol.api import JobCreate
from services.protocol.swebench import SweBenchRolloutRequest, SweInstance
from services.protocol.tasks import AgentLimits, RewardSpec, RolloutRequest, Task
from services.runtime.sync_redis import open_sync_redis
from tests.rollout_api.fleet import ADMIN, SUBMIT, Fleet, running_fleet
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap]

RULES: dict[str, list[Any]] = {"SOLVE": ["```bash\necho 42 > answer.txt\n```", SUBMIT]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("client-fleet"), RULES, "client") as fleet:
        fleet.start_worker(jobs=["c-sync", "c-async", "c-frameworks"], concurrency=8)
        yield fleet


def tasks(n: int) -> list[Task]:
    reward = RewardSpec(command='test "$(cat answer.txt)" = 42')
    return [Task(id=f"t{i}", prompt="SOLVE it", reward=reward) for i in range(n)]


@pytest.mark.timeout(600)  # the first test waits for the fleet to start (minutes on a loaded machine)
def test_sync_client_submits_follows_and_reads_every_trajectory_once(fleet: Fleet) -> None:
    with RolloutClient(fleet.api.url) as client:
        with pytest.raises(Unauthorized):
            client.create_job(JobCreate(job="c-sync"), admin_token="wrong")
        client.token = client.create_job(JobCreate(job="c-sync"), admin_token=ADMIN).token
        request = RolloutRequest(job="c-sync", tasks=tasks(2), group_size=2, limits=AgentLimits(max_turns=3))
        accepted = client.submit(request)
        seen = list(client.follow(accepted.rollout_id, every_s=0.2))
        assert seen[-1].finished == seen[-1].total == 4 and seen[-1].by_status["completed"] == 4
        assert client.wait(accepted.rollout_id).finished == 4
        figures = client.job("c-sync")
        assert figures.finished == 4 and figures.by_status["completed"] == 4 and figures.queue_depth == 0

        streamed = list(client.trajectories("c-sync", limit=4))
        assert {e.trajectory.trajectory_id for e in streamed} == {
            f"{accepted.rollout_id}:t{i}:{s}" for i in range(2) for s in range(2)
        }
        assert all(e.trajectory.reward == 1.0 and e.trajectory.status is Status.COMPLETED for e in streamed)
        rest = list(client.trajectories("c-sync", after=streamed[1].entry_id, limit=2))  # resumed after an entry
        assert [e.entry_id for e in rest] == [e.entry_id for e in streamed[2:]]
        with pytest.raises(TimeoutError):  # nothing more comes: the wait ends at the next keep-alive
            list(client.trajectories("c-sync", after=streamed[-1].entry_id, idle_timeout_s=0.1))

        with open_sync_redis(fleet.redis_url) as r:
            consumer = TrajectoryConsumer(r, "c-sync")
            consumer.ensure_group()
            read = consumer.read(count=10, block_ms=100)
            assert [e.entry_id for e in read] == [e.entry_id for e in streamed]
            assert consumer.ack(e.entry_id for e in read) == 4 and consumer.read(10, 10) == []

        with pytest.raises(NotFound):
            client.rollout("no-such-rollout")
        with pytest.raises(Unauthorized) as forbidden:  # another job's stream
            list(client.trajectories("other-job", limit=1))
        assert forbidden.value.status == 403
        instance = SweInstance(instance_id="x__y-1", repo="x/y", base_commit="abc", problem_statement="fix it",
                               FAIL_TO_PASS=["tests/test_y.py::test_y"])  # fmt: skip
        swe = SweBenchRolloutRequest(job="c-sync", instances=[instance], template="no-such-template")
        with pytest.raises(BadRequest) as refused:
            client.submit_swebench(swe)
        assert refused.value.code is not None and not refused.value.infra


async def test_async_client(fleet: Fleet) -> None:
    async with AsyncRolloutClient(fleet.api.url) as client:
        client.token = (await client.create_job(JobCreate(job="c-async"), admin_token=ADMIN)).token
        accepted = await client.submit(RolloutRequest(job="c-async", tasks=tasks(1), group_size=2))
        assert (await client.wait(accepted.rollout_id, timeout_s=120, every_s=0.2)).finished == 2
        assert (await client.job("c-async")).finished == 2
        events = [e async for e in client.trajectories("c-async", limit=2)]
        assert {e.trajectory.rollout_id for e in events} == {accepted.rollout_id}
        with pytest.raises(NotFound):
            await client.cancel("no-such-rollout")


def test_weights_posted_through_the_proxy_are_served(fleet: Fleet, tmp_path: Path) -> None:
    export = tmp_path / "v7"
    export.mkdir()
    (export / "config.json").write_text("{}")
    publisher = WeightPublisher(fleet.proxy.url, pool="default", token=ADMIN)
    try:
        outcome = publisher.publish(seal(export, "7"))
    finally:
        publisher.close()
    assert outcome.ok and outcome.result is not None and outcome.result.version == "7", outcome
    served = httpx.get(fleet.engines["default"].url + "/get_weight_version", timeout=30).json()
    assert served["weight_version"] == "7", served


async def test_slime_and_verl_adapters_run_episodes_on_the_fleet(fleet: Fleet) -> None:
    from argparse import Namespace

    from rollout_client import episodes, slime, verl
    from tests.rollout_client.framework_types import SlimeSample, VerlAgentLoopMetrics, VerlAgentLoopOutput

    async with AsyncRolloutClient(fleet.api.url) as admin:
        token = (await admin.create_job(JobCreate(job="c-frameworks"), admin_token=ADMIN)).token
    runner = episodes.configure(episodes.EpisodeConfig(fleet.api.url, token, "c-frameworks"))
    task = {"id": "solve", "reward": {"command": 'test "$(cat answer.txt)" = 42'}}
    samples = [SlimeSample(prompt="SOLVE it", metadata={"task": task}) for _ in range(2)]
    done = await asyncio.gather(*(slime.generate(Namespace(), s, {"temperature": 1.0, "max_new_tokens": 64})
                                  for s in samples))  # fmt: skip
    for sample in done:
        assert sample.status is SlimeSample.Status.COMPLETED and sample.reward == 1.0 and not sample.remove_sample
        assert sample.loss_mask is not None and len(sample.loss_mask) == sample.response_length > 0
        assert 0 in sample.loss_mask and len(sample.weight_versions) == 2  # two turns, an observation between
    traj = await runner.run(episodes.task_of("SOLVE it", {"task": task}))
    out = verl.to_output(traj, VerlAgentLoopOutput, VerlAgentLoopMetrics)
    assert out.reward_score == 1.0 and out.response_mask == traj.loss_mask.tolist()
    await runner.client.aclose()

"""The rollout API client (sync and async) against a tiny real FastAPI app over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollout_client.errors import RolloutApiError
from rollout_client.http import AsyncRolloutClient, RolloutClient
from services.protocol.api import JobCreate
from services.protocol.status import ErrorCode
from services.protocol.tasks import RewardSpec, RolloutRequest, Task
from tests.trainer.fake_fleet import ADMIN_TOKEN, FleetState, serve_fleet


@pytest.fixture
def fleet(redis_url: str) -> Iterator[tuple[str, FleetState]]:
    with serve_fleet(redis_url) as served:
        yield served


def request(key: str | None = None) -> RolloutRequest:
    tasks = [Task(id=f"t{i}", prompt="add two numbers", reward=RewardSpec(command="true")) for i in range(2)]
    return RolloutRequest(job="job1", tasks=tasks, group_size=3, idempotency_key=key)


def test_sync_client_round_trip(fleet: tuple[str, FleetState]) -> None:
    url, state = fleet
    client = RolloutClient(url)
    try:
        created = client.create_job(JobCreate(job="job1"), admin_token=ADMIN_TOKEN)
        client.token = created.token
        assert client.job("job1").pool == "default"
        accepted = client.submit(request("k1"))
        assert (accepted.tasks, accepted.trajectories, accepted.duplicate) == (2, 6, False)
        again = client.submit(request("k1"))
        assert again.duplicate and again.rollout_id == accepted.rollout_id and state.requested_groups == 2
        assert client.rollout(accepted.rollout_id).total == 6
        assert client.cancel(accepted.rollout_id).cancelled
        with pytest.raises(RolloutApiError) as err:
            client.rollout("nope")
        assert err.value.status == 404 and err.value.body is not None
        assert err.value.body.error.code is ErrorCode.NOT_FOUND and not err.value.infra
        with pytest.raises(RolloutApiError) as err:
            client.create_job(JobCreate(job="job2"), admin_token="wrong")
        assert err.value.status == 401
    finally:
        client.close()


async def test_async_client_round_trip(fleet: tuple[str, FleetState]) -> None:
    url, _ = fleet
    client = AsyncRolloutClient(url)
    try:
        await client.create_job(JobCreate(job="job1"), admin_token=ADMIN_TOKEN)
        accepted = await client.submit(request())
        assert (await client.rollout(accepted.rollout_id)).finished == 6
        with pytest.raises(RolloutApiError) as err:
            await client.job("missing")
        assert err.value.body is not None and err.value.body.error.code is ErrorCode.UNKNOWN_JOB
    finally:
        await client.aclose()

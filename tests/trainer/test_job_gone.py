"""A job that leaves the store while the trainer reads it (a Redis restarted empty) stops the
trainer with ``JobGone`` on every rank, the leader's broadcast carrying it (issue 29)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import redis

from rollout_client.errors import JobGone
from rollout_client.stream import TrajectoryConsumer
from services.protocol.status import ErrorCode
from trainer_client.checkpoint import TrainerState
from trainer_client.ranks import Ranks
from trainer_client.settings import TrainSettings
from trainer_client.trainer import Trainer


class _Feed:
    def __init__(self, consumer: TrajectoryConsumer) -> None:
        self.consumer = consumer

    def gather(self, step: int) -> list[Any]:
        self.consumer.read(count=10, block_ms=10)
        return []


class _Follower(Ranks):
    """A rank that is not the leader: it gets what the leader broadcast."""

    def __init__(self, leaders: list[Any]) -> None:
        super().__init__(rank=1, world=2)
        self.leaders = leaders

    def broadcast(self, obj: Any) -> Any:
        return self.leaders[-1]


def _trainer(ranks: Ranks, feed: Any) -> Trainer:
    return Trainer(settings=TrainSettings(job="gone"), policy=cast(Any, None), learner=cast(Any, None),
                   state=TrainerState(), ranks=ranks, feed=feed)  # fmt: skip


def test_every_rank_is_told_the_job_is_gone(redis_client: redis.Redis) -> None:
    consumer = TrajectoryConsumer(redis_client, "gone")
    consumer.ensure_group()
    redis_client.flushall()
    sent: list[Any] = []

    class _Leader(Ranks):
        def broadcast(self, obj: Any) -> Any:
            sent.append(obj)
            return obj

    with pytest.raises(JobGone) as leader:
        _trainer(_Leader(), _Feed(consumer)).next_batch()
    assert leader.value.code is ErrorCode.UNKNOWN_JOB and "'gone'" in str(leader.value)
    with pytest.raises(JobGone):
        _trainer(_Follower(sent), None).next_batch()  # what the other ranks get instead of waiting

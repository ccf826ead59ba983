"""Admission control and over-provisioning of rollout requests.

At most ``(max_staleness + 1) x batch_groups`` groups are in flight (requested and not yet
trained on or dropped): the API is never asked for work that would be too stale to train on by
the time it arrives. Within that cap the trainer keeps ``overprovision x batch_groups`` groups
in flight, trains on the first complete ones and carries the rest into the next step, so a step
never waits for the slowest trajectory of the fleet.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator
from pathlib import Path

from rollout_client.http import RolloutClient
from services.protocol.tasks import AgentLimits, RolloutRequest, SamplingParams, Task

logger = logging.getLogger(__name__)


class Admission:
    """How many groups to request now, given how many are in flight."""

    def __init__(self, batch_groups: int, max_staleness: int, overprovision: float) -> None:
        self.cap = (max_staleness + 1) * batch_groups
        self.target = min(self.cap, math.ceil(overprovision * batch_groups))

    def to_request(self, in_flight: int) -> int:
        return max(0, self.target - in_flight)


def load_tasks(path: Path) -> list[Task]:
    """Tasks from a JSONL file, one :class:`Task` per line."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [Task.model_validate_json(line) for line in lines]


class RolloutSupply:
    """Keeps the API supplied with task groups for one job, within the admission cap."""

    def __init__(
        self,
        client: RolloutClient,
        job: str,
        tasks: list[Task],
        admission: Admission,
        group_size: int,
        sampling: SamplingParams,
        limits: AgentLimits,
    ) -> None:
        if not tasks:
            raise ValueError("no tasks to submit")
        self.client, self.job, self.admission = client, job, admission
        self.group_size, self.sampling, self.limits = group_size, sampling, limits
        self._tasks: Iterator[Task] = itertools.cycle(tasks)
        self.requested = 0  # groups requested so far (restored from the checkpoint on resume)

    def top_up(self, finished_groups: int) -> int:
        """Request groups up to the target; ``finished_groups`` = groups trained on or dropped so far.

        The idempotency key is the count of groups requested before: a trainer resumed from a
        checkpoint repeats the same keys, and the API answers them without queueing twice.
        """
        want = self.admission.to_request(self.requested - finished_groups)
        if want == 0:
            return 0
        tasks = [next(self._tasks) for _ in range(want)]
        request = RolloutRequest(
            job=self.job, tasks=_unique(tasks), group_size=self.group_size, sampling=self.sampling,
            limits=self.limits, idempotency_key=f"{self.job}-from-group-{self.requested}",
        )  # fmt: skip
        accepted = self.client.submit(request)
        self.requested += accepted.tasks
        logger.info("requested %d groups (rollout %s), %d in flight", accepted.tasks, accepted.rollout_id,
                    self.requested - finished_groups)  # fmt: skip
        return accepted.tasks

    def in_flight(self, finished_groups: int) -> int:
        return self.requested - finished_groups


def _unique(tasks: list[Task]) -> list[Task]:
    """A rollout's group is (rollout x task): a task repeated within one request gets a suffixed id."""
    seen: dict[str, int] = {}
    out = []
    for task in tasks:
        n = seen[task.id] = seen.get(task.id, 0) + 1
        out.append(task if n == 1 else task.model_copy(update={"id": f"{task.id}.{n}"}))
    return out

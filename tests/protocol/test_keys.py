"""Key names: one module, and a job's keys share one Redis Cluster slot."""

from __future__ import annotations

import inspect

from redis.crc import key_slot

from services.protocol import keys


def test_every_per_job_key_hashes_to_the_same_slot() -> None:
    builders = [
        keys.job_record("job-a"),
        keys.work_stream("job-a"),
        keys.trajectory_stream("job-a"),
        keys.rollout_record("job-a", "r1"),
        keys.rollout_index("job-a"),
        keys.idempotency("job-a", "k"),
        keys.published("job-a"),
        keys.job_stats("job-a"),
    ]
    slots = {key_slot(k.encode()) for k in builders}
    assert len(slots) == 1
    assert all("{job-a}" in k for k in builders)


def test_different_jobs_get_different_keys() -> None:
    assert keys.work_stream("a") != keys.work_stream("b")
    assert keys.trajectory_stream("a") != keys.work_stream("a")


def test_all_builders_share_the_prefix() -> None:
    for name, fn in inspect.getmembers(keys, inspect.isfunction):
        if name.startswith("_"):
            continue
        args = ["x"] * len(inspect.signature(fn).parameters)
        assert fn(*args).startswith(keys.PREFIX + ":"), name

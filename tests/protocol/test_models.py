"""The user-facing models: defaults from DESIGN.md and validation that names the field."""

from __future__ import annotations

import pydantic
import pytest

from services.protocol import (
    INFRA_CODES,
    AgentLimits,
    ErrorBody,
    ErrorCode,
    RolloutRequest,
    SamplingParams,
    Status,
    Task,
    WeightUpdate,
    WorkItem,
)

TASK = {"id": "t1", "prompt": "fix the bug", "reward": {"command": "pytest -q"}}


def test_agent_limit_defaults_match_the_field_run() -> None:
    limits = AgentLimits()
    assert (limits.max_turns, limits.max_tokens_per_turn, limits.max_trajectory_tokens) == (80, 8_192, 65_536)


def test_rollout_request_defaults() -> None:
    req = RolloutRequest.model_validate({"job": "job-a", "tasks": [TASK]})
    assert req.group_size == 8
    assert req.tasks[0].sandbox.network == "none"
    assert req.limits == AgentLimits()


def test_validation_error_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        RolloutRequest.model_validate({"job": "job-a", "tasks": [{**TASK, "prompt": ""}], "group_size": 0})
    locs = {tuple(e["loc"]) for e in err.value.errors()}
    assert ("tasks", 0, "prompt") in locs
    assert ("group_size",) in locs


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "{tag}", "x" * 200])
def test_job_names_that_would_break_keys_are_refused(bad: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        RolloutRequest.model_validate({"job": bad, "tasks": [TASK]})


def test_unknown_fields_are_refused_on_tasks_but_passed_on_sampling() -> None:
    with pytest.raises(pydantic.ValidationError):
        Task.model_validate({**TASK, "promt": "typo"})
    params = SamplingParams.model_validate({"temperature": 0.7, "min_p": 0.05, "json_schema": "{}"})
    dumped = params.model_dump()
    assert dumped["min_p"] == 0.05 and dumped["json_schema"] == "{}"


def test_work_item_round_trips_through_json() -> None:
    task = Task.model_validate(TASK)
    item = WorkItem(
        job="job-a", rollout_id="r1", trajectory_id=WorkItem.make_trajectory_id("r1", "t1", 2),
        task=task, group_id=WorkItem.make_group_id("r1", "t1"), sample_index=2, group_size=4,
    )  # fmt: skip
    assert WorkItem.model_validate_json(item.model_dump_json()) == item
    assert WorkItem.decode(item.encode(), item.task) == item and b"prompt" not in item.encode()
    assert WorkItem.task_ref(item.encode()) == (item.rollout_id, item.task.id)
    assert item.trajectory_id == "r1:t1:2"


def test_weight_update_requires_checksum() -> None:
    with pytest.raises(pydantic.ValidationError):
        WeightUpdate.model_validate({"pool": "p", "version": "v1", "location": "/w"})
    assert WeightUpdate(pool="p", version="v1", location="/w", checksum="sha256:ab").pause_mode == "retract"


def test_error_codes_say_infra_or_request() -> None:
    assert ErrorCode.NO_HEALTHY_ENGINE.infra and ErrorCode.SANDBOX_DIED.infra
    assert not ErrorCode.CONTEXT_LENGTH_EXCEEDED.infra and not ErrorCode.QUOTA_EXCEEDED.infra
    body = ErrorBody.of(ErrorCode.UPSTREAM_TIMEOUT, "engine e-1 took too long")
    assert body.model_dump()["error"] == {
        "code": "upstream_timeout", "message": "engine e-1 took too long", "infra": True,
        "field": None, "retry_after_s": None,
    }  # fmt: skip
    assert all(code.infra for code in INFRA_CODES)


def test_only_completed_and_truncated_are_trainable() -> None:
    assert {s for s in Status if s.trainable} == {Status.COMPLETED, Status.TRUNCATED}


def test_every_error_code_has_one_http_status() -> None:
    from services.protocol import PlatformError
    from services.protocol.status import HTTP_STATUS, request_error_code

    assert set(HTTP_STATUS) == set(ErrorCode)
    for code, status in HTTP_STATUS.items():
        # request errors are 4xx; infra failures 5xx, bar 410 for a sandbox that is gone
        assert (status >= 500 or status == 410) if code.infra else (400 <= status < 500), code
        assert PlatformError(code, "x").status == status
        if not code.infra:  # a bare status maps back to a code that answers with it
            assert request_error_code(status).http_status == status
    assert PlatformError(ErrorCode.QUOTA_EXCEEDED, "x", retry_after_s=0.2).headers() == {"Retry-After": "1"}
    assert PlatformError(ErrorCode.QUOTA_EXCEEDED, "x").headers() == {}


def test_metadata_holds_only_what_the_trajectory_codec_carries() -> None:
    """An integer past msgpack's range was accepted, then failed every delivery of its item (issue 29)."""
    edges = {"lo": -(2**63), "hi": 2**64 - 1, "flag": True, "deep": [{"x": 1.5}], "none": None}
    assert Task.model_validate({**TASK, "metadata": edges}).metadata == edges
    for bad, where in [({"n": 2**64}, "n"), ({"a": [{"b": -(2**63) - 1}]}, "a.0.b"), ({"f": float("inf")}, "f")]:
        with pytest.raises(pydantic.ValidationError, match=where.replace(".", r"\.")) as info:
            Task.model_validate({**TASK, "metadata": bad})
        assert info.value.errors()[0]["loc"] == ("metadata",)

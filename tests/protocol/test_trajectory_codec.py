"""Round trips of the trajectory record: no field silently dropped, token data exact."""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec
import pytest
import redis

from services.protocol import (
    Cap,
    ErrorCode,
    InfraFailure,
    InfraStage,
    Message,
    RewardDetails,
    Status,
    Timings,
    Trajectory,
    Turn,
    decode_trajectory,
    encode_trajectory,
    from_stream_fields,
    logprobs,
    mask,
    to_stream_fields,
    token_ids,
    trajectory_from_json,
    trajectory_to_json,
)


def make(n_response: int, *, seed: int = 0, status: Status = Status.COMPLETED) -> Trajectory:
    rng = random.Random(seed)
    return Trajectory(
        trajectory_id="roll-1:task-α:3",
        attempt=2,
        job="job-a",
        rollout_id="roll-1",
        task_id="task-α",
        group_id="roll-1:task-α",
        sample_index=3,
        group_size=8,
        status=status,
        truncation=Cap.TURNS if status is Status.TRUNCATED else None,
        infra=InfraFailure(stage=InfraStage.SANDBOX_EXEC, code="sandbox_died", message="gone", attempts=3)
        if status is Status.INFRA_ERROR
        else None,
        reward=0.5 if status.trainable else None,
        reward_details=RewardDetails(exit_code=1, output="FAILED tests/test_x.py::test_é\n", duration_s=2.5),
        prompt_ids=token_ids(rng.randrange(2**31 - 1) for _ in range(512)),
        response_ids=token_ids(rng.randrange(151_000) for _ in range(n_response)),
        loss_mask=mask(rng.randrange(2) for _ in range(n_response)),
        response_logprobs=logprobs(-rng.random() * 10 for _ in range(n_response)),
        turns=[
            Turn(
                index=0,
                response_offset=0,
                response_tokens=7,
                prompt_tokens=512,
                cached_tokens=500,
                weight_version="v12",
                engine_id="e-3",
                finish_reason="stop",
                llm_s=3.25,
                exec_s=0.5,
                exit_code=2,
                observation_tokens=40,
            ),
            Turn(
                index=1,
                response_offset=47,
                response_tokens=9,
                prompt_tokens=559,
                weight_version="v13",
                engine_id="e-3",
                finish_reason="length",
                llm_s=4.0,
            ),
        ],  # fmt: skip
        timings=Timings(queued_s=0.1, sandbox_start_s=0.02, llm_s=7.25, exec_s=0.5, reward_s=2.5, total_s=11.0),
        messages=[Message("system", "You are an agent."), Message("user", "修复这个错误 🐛 — naïve café")],
        metadata={"repo": "psf/requests", "difficulty": 3, "nested": {"a": [1, 2.5, None]}},
        source="swe-smith",
        source_version="sha256:0123abcd",
        worker="worker-7",
        started_at=1_700_000_000.25,
        finished_at=1_700_000_011.25,
    )


def test_msgpack_round_trip_keeps_every_field() -> None:
    traj = make(2_000)
    back = decode_trajectory(encode_trajectory(traj))
    assert back == traj
    # every field listed in the struct survived, not only the ones == happens to compare
    for name in traj.__struct_fields__:
        assert getattr(back, name) == getattr(traj, name), name
    assert back.weight_versions == ["v12", "v13"]
    assert back.key == ("roll-1:task-α:3", 2)


def test_64k_token_trajectory_round_trips_exactly() -> None:
    traj = make(65_536 - 512, seed=7)
    body = encode_trajectory(traj)
    back = decode_trajectory(body)
    assert back.total_tokens == 65_536
    assert back.response_ids == traj.response_ids
    assert back.loss_mask == traj.loss_mask
    # float32 logprobs are exact after the round trip (no text conversion)
    assert back.response_logprobs.tobytes() == traj.response_logprobs.tobytes()
    # packed, not a JSON list of numbers: about 4 + 4 + 1 bytes per response token
    assert len(body) < 10 * 65_536


def test_token_arrays_are_packed_as_raw_bytes() -> None:
    traj = make(1_000)
    body = encode_trajectory(traj)
    assert traj.response_ids.tobytes() in body
    assert traj.response_logprobs.tobytes() in body


@pytest.mark.parametrize("status", list(Status))
def test_every_status_round_trips(status: Status) -> None:
    traj = make(10, status=status)
    traj.check()
    assert decode_trajectory(encode_trajectory(traj)).status is status


def test_json_round_trip_for_http_consumers() -> None:
    traj = make(300)
    text = trajectory_to_json(traj)
    doc = msgspec.json.decode(text)
    assert doc["response_ids"][:3] == traj.response_ids[:3].tolist()
    assert doc["messages"][1]["content"] == "修复这个错误 🐛 — naïve café"
    back = trajectory_from_json(text)
    assert back.response_ids == traj.response_ids
    assert all(
        math.isclose(a, b, rel_tol=1e-6) for a, b in zip(back.response_logprobs, traj.response_logprobs, strict=True)
    )
    assert back.turns == traj.turns and back.metadata == traj.metadata


def test_records_of_either_side_of_the_source_fields_decode() -> None:
    """A body written before ``source`` existed decodes with the defaults; a reader that predates
    it ignores the new fields (msgspec skips unknown keys)."""
    traj = make(8)
    doc = msgspec.msgpack.decode(encode_trajectory(traj))
    old_body = msgspec.msgpack.encode({k: v for k, v in doc.items() if k not in ("source", "source_version")})
    back = decode_trajectory(old_body)
    assert (back.source, back.source_version) == ("platform", "") and back.response_ids == traj.response_ids

    class OldTrajectory(msgspec.Struct, kw_only=True):
        trajectory_id: str
        metadata: dict[str, Any] = {}

    old = msgspec.msgpack.decode(encode_trajectory(traj), type=OldTrajectory)
    assert old.trajectory_id == traj.trajectory_id and old.metadata == traj.metadata


def test_check_rejects_misaligned_arrays() -> None:
    traj = make(10)
    traj.loss_mask.append(1)
    with pytest.raises(ValueError, match="must match response_ids"):
        traj.check()


def test_check_rejects_truncated_without_cap() -> None:
    traj = make(10, status=Status.TRUNCATED)
    traj.truncation = None
    with pytest.raises(ValueError, match="truncation"):
        traj.check()


def test_decode_rejects_garbage() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_trajectory(b"\x93not a trajectory")


def test_stream_entry_through_real_redis(redis_client: redis.Redis) -> None:
    traj = make(65_536 - 512, seed=3)
    stream = "rollout:job:{job-a}:traj"
    redis_client.xgroup_create(stream, "trainer", id="0", mkstream=True)
    redis_client.xadd(stream, to_stream_fields(traj))  # type: ignore[arg-type]
    reply: Any = redis_client.xreadgroup("trainer", "c", {stream: ">"}, count=1)
    _, entry = reply[0][1][0]
    # readable summary fields beside the compact body
    assert entry[b"job"] == b"job-a"
    assert entry[b"task"] == "task-α".encode()
    assert entry[b"status"] == b"completed"
    assert float(entry[b"reward"]) == 0.5
    assert entry[b"attempt"] == b"2"
    assert from_stream_fields(entry) == traj


def test_an_infra_error_has_no_reward_anywhere() -> None:
    """Null in the body and the JSON, empty in the stream's readable field: nothing to train on."""
    traj = make(16, seed=4)
    traj.status, traj.reward = Status.INFRA_ERROR, None
    traj.infra = InfraFailure(stage=InfraStage.LLM, code=ErrorCode.ENGINE_ERROR, message="engine down")
    traj.check()
    fields = to_stream_fields(traj)
    assert fields["reward"] == "" and from_stream_fields(fields).reward is None  # type: ignore[arg-type]
    assert msgspec.json.decode(trajectory_to_json(traj))["reward"] is None
    with pytest.raises(ValueError, match="no reward to train on"):
        _ = traj.trainable_reward
    traj.reward = 0.0  # the fake 0 a consumer might train on is refused at publication
    with pytest.raises(ValueError, match="reward is set exactly when"):
        traj.check()

"""ATIF (Harbor's trajectory format): the models accept a document shaped like the format's own
published example and refuse broken ones; a trajectory exported as ATIF and imported back is the
same record, token ids, logprobs and loss mask included, through the dump files and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
from pydantic import ValidationError

from services.protocol import Message, Status, Trajectory, keys, to_stream_fields, trajectory_from_json
from services.protocol import trajectory_to_json as to_json
from services.protocol.atif import ATIF_VERSION, AtifTrajectory, from_atif, to_atif
from services.protocol.status import Cap
from services.rollout_api.dump import atif_line, export_job, import_dump, read_dump, stream_entries
from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.factories import make_trajectory


def with_messages(traj: Trajectory) -> Trajectory:
    """The readable messages the worker records: system, task, then per turn the reply and its observation."""
    messages = [Message("system", "You are a shell agent."), Message("user", "Count the lines of data.txt")]
    for i in range(len(traj.turns)):
        messages.append(Message("assistant", f"```bash\nwc -l data.txt  # turn {i}\n```"))
        if i < len(traj.turns) - 1:
            messages.append(Message("user", f"<returncode>0</returncode>\n<output>{i}</output>"))
    return msgspec.structs.replace(traj, messages=messages)


def round_trip(traj: Trajectory) -> Trajectory:
    doc = AtifTrajectory.model_validate_json(atif_line(traj))  # the JSON line validates as ATIF
    assert doc.schema_version == ATIF_VERSION and doc.session_id == traj.attempt_key
    return trajectory_from_json(msgspec.json.encode(from_atif(doc)))


@pytest.mark.parametrize(
    "traj",
    [
        with_messages(make_trajectory("g", 0, turns=3, gen_len=5, obs_len=4, seed=1)),
        make_trajectory("g", 1, turns=1, seed=2),  # no messages recorded
        make_trajectory("g", 2, status=Status.INFRA_ERROR, turns=0, seed=3),  # nothing generated
        msgspec.structs.replace(
            make_trajectory("g", 3, turns=2, seed=4), status=Status.TRUNCATED, truncation=Cap.TURNS
        ),
    ],
    ids=["messages", "bare", "infra-error", "truncated"],
)
def test_a_trajectory_round_trips_token_exact(traj: Trajectory) -> None:
    back = round_trip(traj)
    assert back.prompt_ids == traj.prompt_ids and back.response_ids == traj.response_ids
    assert back.response_logprobs == traj.response_logprobs and back.loss_mask == traj.loss_mask
    assert back == traj  # every other field too


def test_agent_steps_carry_the_turns_tokens() -> None:
    traj = with_messages(make_trajectory("g", 0, turns=2, gen_len=3, obs_len=2, prompt_len=4, seed=7))
    doc = to_atif(msgspec.json.decode(to_json(traj)))
    assert [s.source for s in doc.steps] == ["system", "user", "agent", "agent"]
    first, second = (s.metrics for s in doc.steps[2:])
    assert first is not None and second is not None
    assert first.prompt_token_ids == traj.prompt_ids.tolist()
    assert first.completion_token_ids == traj.response_ids[:3].tolist()
    assert second.prompt_token_ids == traj.prompt_ids.tolist() + traj.response_ids[:5].tolist()  # with the observation
    assert first.logprobs == pytest.approx(traj.response_logprobs[:3].tolist())
    assert doc.steps[2].observation is not None and doc.steps[2].observation.results[0].content.startswith("<return")  # type: ignore[union-attr]
    assert doc.final_metrics is not None and doc.final_metrics.total_completion_tokens == 6


def published_example_shape() -> dict[str, Any]:
    """A document built like the format's published multi-step example (a user question, an agent step
    with two parallel tool calls and their observations, a final answer with token ids and logprobs)."""
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "3f1c9a2e-session",
        "agent": {"name": "some-agent", "version": "0.3.0", "model_name": "tiny-llm", "extra": {}},
        "notes": "two lookups, then an answer",
        "final_metrics": {"total_prompt_tokens": 900, "total_completion_tokens": 60, "total_cached_tokens": 100,
                          "total_cost_usd": 0.0004, "total_steps": 3, "extra": {}},
        "steps": [
            {"step_id": 1, "timestamp": "2025-10-11T10:30:00Z", "source": "user", "message": "Weather in Oslo?"},
            {"step_id": 2, "source": "agent", "model_name": "tiny-llm", "reasoning_effort": "medium",
             "message": "Looking it up.", "reasoning_content": "Two lookups at once.",
             "tool_calls": [{"tool_call_id": "c1", "function_name": "weather", "arguments": {"city": "Oslo"}},
                            {"tool_call_id": "c2", "function_name": "time", "arguments": {}}],
             "observation": {"results": [{"source_call_id": "c1", "content": "4 C"},
                                         {"source_call_id": "c2", "content": "10:31"}]},
             "metrics": {"prompt_tokens": 400, "completion_tokens": 20, "cached_tokens": 100, "cost_usd": 0.0002}},
            {"step_id": 3, "source": "agent", "message": "It is 4 C.", "reasoning_effort": 0.2,
             "metrics": {"prompt_tokens": 500, "completion_tokens": 4, "completion_token_ids": [11, 12, 13, 14],
                         "logprobs": [-0.1, -0.2, -0.05, -0.3], "extra": {"reasoning_tokens": 2}}},
        ],
    }  # fmt: skip


def test_a_document_like_the_published_example_validates() -> None:
    doc = AtifTrajectory.model_validate(published_example_shape())
    assert doc.steps[1].tool_calls is not None and len(doc.steps[1].tool_calls) == 2
    with pytest.raises(ValueError, match=r"extra\.rollout"):
        from_atif(doc)  # valid ATIF, but not one of ours: import refuses it instead of guessing


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("steps", 1, "step_id"), 7),  # out of order
        (("steps", 0, "source"), "tool"),  # not a source
        (("steps", 0, "metrics"), {"prompt_tokens": 3}),  # metrics on a user step
        (("steps", 1, "observation", "results", 0, "source_call_id"), "c9"),  # no such tool call
        (("schema_version",), "ATIF-v2.0"),
        (("agent", "colour"), "blue"),  # unknown fields go in extra
        (("steps", 1, "metrics", "cached_tokens"), 500),  # more cached than sent
    ],
)
def test_broken_documents_are_refused(path: tuple[Any, ...], value: Any) -> None:
    doc = published_example_shape()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValidationError):
        AtifTrajectory.model_validate(doc)


def test_dump_and_cli_round_trip_through_atif(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    original = [with_messages(make_trajectory(f"t{i}", 0, turns=2, job="src", seed=i)) for i in range(3)]
    for traj in original:
        fields: Any = to_stream_fields(traj)
        redis_client.xadd(keys.trajectory_stream("src"), fields)
    assert export_job(redis_client, "src", tmp_path / "d.atif.jsonl.gz", fmt="atif") == 3
    assert list(read_dump(tmp_path / "d.atif.jsonl.gz")) == original
    assert import_dump(redis_client, tmp_path / "d.atif.jsonl.gz", job="copy") == 3
    assert [msgspec.structs.replace(t, job="src") for _, t in stream_entries(redis_client, "copy")] == original

    run = [sys.executable, "-m", "services.cli", "trajectories"]
    env = python_env({"ROLLOUT_REDIS_URL": redis_url})
    out = tmp_path / "cli.jsonl"
    subprocess.run([*run, "export", "--job", "src", "--format", "atif", "--out", str(out)], env=env, cwd=REPO_ROOT,
                   check=True, capture_output=True)  # fmt: skip
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["session_id"] for d in docs] == [t.attempt_key for t in original]
    subprocess.run([*run, "import", "--file", str(out), "--job", "cli"], env=env, cwd=REPO_ROOT, check=True,
                   capture_output=True)  # fmt: skip
    assert [t.response_logprobs for _, t in stream_entries(redis_client, "cli")] == [
        t.response_logprobs for t in original
    ]

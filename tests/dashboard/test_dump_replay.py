"""Dumps (``rollout trajectories export|import``) round-trip a job's stream; a replay sends a dump's
LLM calls to a real proxy over simulated engines as sessions with growing prompts at the recorded pacing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from services.benchmarks.proxy_fleet import Launched, start_engines, start_proxy, stopping
from services.benchmarks.replay import sessions_from
from services.protocol import Timings, Trajectory, keys, to_stream_fields
from services.rollout_api.dump import export_job, import_dump, read_dump, stream_entries
from tests.support.processes import REPO_ROOT, python_env
from tests.trainer.factories import make_trajectory


def recorded(job: str, n: int) -> list[Trajectory]:
    """``n`` three-turn trajectories that started 0.2 s apart; each command took 0.3 s."""
    out = []
    for i in range(n):
        traj = make_trajectory(f"t{i}", 0, turns=3, gen_len=5, obs_len=4, prompt_len=20, job=job, seed=i)
        turns = [msgspec.structs.replace(t, exec_s=0.3) for t in traj.turns]
        timings = Timings(sandbox_start_s=0.1, setup_s=0.1)
        out.append(msgspec.structs.replace(traj, trajectory_id=f"r1:t{i}:0", turns=turns, timings=timings,
                                           started_at=1000.0 + 0.2 * i))  # fmt: skip
    return out


def put(client: redis.Redis, trajectories: list[Trajectory]) -> None:
    for traj in trajectories:
        fields: Any = to_stream_fields(traj)
        client.xadd(keys.trajectory_stream(traj.job), fields)


@pytest.mark.parametrize("name", ["dump.jsonl", "dump.jsonl.gz"])
def test_export_then_import_round_trips(redis_client: redis.Redis, tmp_path: Path, name: str) -> None:
    original = recorded("src", 5)
    put(redis_client, original)
    assert export_job(redis_client, "src", tmp_path / name) == 5
    assert [t.key for t in read_dump(tmp_path / name)] == [t.key for t in original]
    assert import_dump(redis_client, tmp_path / name, job="copy") == 5
    copied = [t for _, t in stream_entries(redis_client, "copy")]
    assert [msgspec.structs.replace(t, job="src") for t in copied] == original


def test_a_bad_dump_writes_nothing(redis_client: redis.Redis, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    put(redis_client, recorded("src", 2))
    export_job(redis_client, "src", good)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(good.read_bytes() + b'{"trajectory_id": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        import_dump(redis_client, bad, job="copy")
    assert redis_client.exists(keys.trajectory_stream("copy")) == 0


def test_cli_export_import(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    put(redis_client, recorded("cli", 3))
    run = [sys.executable, "-m", "services.cli", "trajectories"]
    env = python_env({"ROLLOUT_REDIS_URL": redis_url})
    out = subprocess.run([*run, "export", "--job", "cli", "--out", str(tmp_path / "d.jsonl")], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "exported 3 trajectories" in out.stdout
    subprocess.run([*run, "import", "--file", str(tmp_path / "d.jsonl"), "--job", "cli2"], env=env, cwd=REPO_ROOT,
                   check=True, capture_output=True)  # fmt: skip
    assert redis_client.xlen(keys.trajectory_stream("cli2")) == 3


def test_sessions_replay_the_recorded_prompts_and_pacing() -> None:
    traj = recorded("j", 2)[1]
    (session,) = sessions_from([traj], scale=2.0)
    prompts = [json.loads(c.body)["input_ids"] for c in session.calls]
    expected = [list(traj.prompt_ids) + list(traj.response_ids[: t.response_offset]) for t in traj.turns]
    assert prompts == expected and [len(p) for p in prompts] == [20, 29, 38]
    assert [json.loads(c.body)["sampling_params"]["max_new_tokens"] for c in session.calls] == [5, 5, 5]
    assert [c.wait_s for c in session.calls] == pytest.approx([0.1, 0.15, 0.15])  # (0.1 + 0.1) / 2, 0.3 / 2


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    logs = tmp_path_factory.mktemp("replay-logs")
    engines, urls = start_engines(2, 1, ["--decode-step-s", "0.001", "--output-tokens", "8"], logs)
    with stopping(engines) as launched:
        launched.append(start_proxy(urls, 1, logs))
        yield launched[-1]


@pytest.mark.slow
def test_replay_against_a_real_proxy(proxy: Launched, redis_client: redis.Redis, tmp_path: Path) -> None:
    put(redis_client, recorded("rep", 6))
    dump = tmp_path / "rep.jsonl"
    export_job(redis_client, "rep", dump)
    figures = tmp_path / "replay.json"
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "proxy", "--replay", str(dump), "--proxy-url", proxy.url,
         "--time-scale", "4", "--json", str(figures)],
        env=python_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(figures.read_text())
    assert (result["sessions"], result["calls"], result["ok"], result["errors"]) == (6, 18, 18, 0)
    assert result["sessions_with_growing_prompts"] == 6
    assert result["affinity"] == 1.0  # two idle engines: every session stays on its engine
    assert sum(result["calls_per_engine"].values()) == 18
    assert result["wall_s"] >= (0.2 * 5 + 0.2 + 2 * 0.3) / 4  # the recorded pacing, scaled, is a lower bound
    assert "replay" in out.stdout

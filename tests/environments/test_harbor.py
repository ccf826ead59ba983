"""Harbor task directories: task.toml, instruction.md, environment/Dockerfile, tests/test.sh and
solution/solve.sh mapped onto the platform's Task (the fixture set: tests/environments/harbor_tasks),
and what the adapter refuses, with the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.environments import harbor, harbor_images
from services.environments.harbor_sets import set_version, task_dirs
from services.taskbuild.imagerecipe import RecipeError
from tests.environments.harbor_support import TASKS
from tests.environments.harbor_support import task_dirs as fixture_dirs


def test_the_fixture_set_has_ten_or_more_tasks_of_each_kind() -> None:
    tasks = [harbor.load(d) for d in fixture_dirs()]
    assert len(tasks) >= 10 and all(t.solution for t in tasks)
    categories = {t.section("metadata")["category"] for t in tasks}
    assert {"shell", "python", "service", "file-repair"} <= categories
    assert task_dirs([TASKS]) == fixture_dirs()


def test_task_toml_maps_onto_the_task() -> None:
    task = harbor.load(TASKS / "csv-total")
    mapped = harbor.to_task(task, "harbor-csv-total", "v1")
    assert (mapped.id, mapped.prompt) == ("csv-total", (TASKS / "csv-total" / "instruction.md").read_text())
    assert (mapped.sandbox.cpus, mapped.sandbox.memory_mb, mapped.sandbox.disk_mb) == (1.0, 1024, 2048)
    assert mapped.sandbox.network == "none" and mapped.sandbox.template == "harbor-csv-total"
    assert mapped.reward.parse_float and mapped.reward.timeout_s == 60.0
    assert "EXPECTED_TOTAL='1234'" in mapped.reward.command  # [verifier.env], for the tests only
    assert "EXPECTED_TOTAL" not in mapped.sandbox.env
    assert set(mapped.reward.files) == {f"{harbor.STAGE}/test.sh"}  # the tests arrive only at grading time
    assert (mapped.source, mapped.source_version) == ("harbor", "v1")
    assert mapped.metadata["harbor"]["agent_timeout_s"] == 120.0
    named = harbor.load(TASKS / "configure-service")  # schema 1.1: [task] name; memory = "1G"
    assert named.name == "configure-service" and harbor.to_task(named, "t", "v").sandbox.memory_mb == 1024


def test_the_dockerfile_resolves_from_and_drops_what_a_sandbox_ignores() -> None:
    text, notes = harbor_images.recipe_text(
        "FROM ubuntu:24.04\n# c\nWORKDIR /app\nRUN apt-get update && \\\n    apt-get install -y jq\nEXPOSE 80\n"
        'CMD ["bash"]\n', harbor_images.DEFAULT_BASES)  # fmt: skip
    assert text.splitlines() == ["FROM mmdebstrap", "WORKDIR /app", "RUN apt-get update &&  apt-get install -y jq"]
    assert len(notes) == 2 and "EXPOSE 80" in notes[0]
    with pytest.raises(RecipeError, match="no local base"):
        harbor_images.recipe_text("FROM alpine:3.20\n", harbor_images.DEFAULT_BASES)
    with pytest.raises(RecipeError, match="no --platform, no AS stage"):
        harbor_images.recipe_text("FROM python:3.12 AS build\n", harbor_images.DEFAULT_BASES)
    assert harbor_images.resolve_base("alpine:3.20", {"alpine:3.20": "/b.tar"}) == "/b.tar"


def test_what_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    task = tmp_path / "t"
    shutil.copytree(TASKS / "hello-world", task)
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment" / "docker-compose.yaml").write_text("services:\n  main: {}\n")
    with pytest.raises(harbor.HarborError, match="docker-compose"):
        harbor.load(task)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(harbor.HarborError, match=r"no tests/test\.sh"):
        harbor.load(task)
    with pytest.raises(harbor.HarborError, match="not a Harbor task directory"):
        task_dirs([tmp_path / "missing"])


def test_the_reward_is_the_file_the_tests_write_and_a_missing_one_is_no_float(tmp_path: Path) -> None:
    """The reward command, run here with bash: reward.txt, reward.json, or exit 3 with nothing."""
    import subprocess

    logs = tmp_path / "logs"
    command = harbor.reward_command({}).replace("/logs/verifier", str(logs)).replace("/tests/test.sh", "test.sh")
    for script, printed, code in (("echo 0.5 > $L/reward.txt", "0.5", 0), ('echo \'{"reward": 1.0}\' > $L/reward.json',
                                  "1.0", 0), ("echo nothing", "", 3)):  # fmt: skip
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        (tmp_path / "test.sh").write_text(script.replace("$L", str(logs)) + "\n")
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert (done.stdout.strip(), done.returncode) == (printed, code), done.stderr


def test_the_set_version_follows_the_content(tmp_path: Path) -> None:
    shutil.copytree(TASKS / "hello-world", tmp_path / "hello-world")
    before = set_version([tmp_path / "hello-world"])
    (tmp_path / "hello-world" / "instruction.md").write_text("changed\n")
    assert set_version([tmp_path / "hello-world"]) != before and before.startswith("sha256:")


def test_the_bench_summary_counts_an_episode_off_its_reference_against_the_source() -> None:
    from services.benchmarks.envs import summary
    from services.environments.harbor_sets import HarborImport
    from services.protocol import Status, Trajectory

    task = harbor.load(TASKS / "hello-world")
    done = HarborImport(tasks=[harbor.to_task(task, "t", "v")], build_s=[0.5], loaded=[task])

    def traj(mode: str, reward: float) -> Trajectory:
        return Trajectory(trajectory_id=f"{mode}:0", attempt=1, job=mode, rollout_id="r", task_id="hello-world",
                          group_id="g", sample_index=0, group_size=1, status=Status.COMPLETED, reward=reward,
                          source="harbor")  # fmt: skip

    good = summary(done, {"oracle": [traj("oracle", 1.0)], "noop": [traj("noop", 0.0)]}, [])
    assert (good["sources_ok"], good["reward_matches_package"], good["episodes"]) == (["harbor"], 1.0, 2)
    bad = summary(done, {"oracle": [traj("oracle", 1.0)], "noop": [traj("noop", 1.0)]}, [])
    assert (bad["sources_ok"], bad["reward_matches_package"], bad["harbor_noop_reward_mean"]) == ([], 0.5, 1.0)

"""SWE instance files: each format's own field names become the SWE route's instances (and tasks),
with the right FAIL_TO_PASS / PASS_TO_PASS, image, base commit, source and source_version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.main import main
from services.environments.swe_files import FormatError, detect, file_version, import_files
from services.rollout_api.swebench import SETUP_PATCH_PATH, instance_task
from tests.environments.swe_rows import (
    ADD,
    ADD_ZERO,
    SUB,
    r2egym_row,
    swebench_row,
    swegym_row,
    swesmith_row,
    write_jsonl,
)


def test_each_format_is_detected_by_its_field_names() -> None:
    assert [detect(r("GOLD")) for r in (swebench_row, swegym_row, swesmith_row, r2egym_row)] == [
        "swebench",
        "swebench",
        "swe-smith",
        "r2e-gym",
    ]  # fmt: skip  (SWE-Gym's rows are SWE-bench's)
    with pytest.raises(FormatError, match="pass --format"):
        detect({"question": "2+2?", "answer": "4"})


def test_swebench_rows_keep_their_tests_patch_and_image(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "swebench.jsonl", [swebench_row("GOLD")])
    [request] = import_files([path], job="j").requests
    [instance] = request.instances
    assert (instance.FAIL_TO_PASS, instance.PASS_TO_PASS) == ([ADD, ADD_ZERO], [SUB])  # from JSON strings
    assert instance.base_commit == "0" * 40 and instance.test_patch and "test_add_zero" in instance.test_patch
    assert (instance.source, instance.source_version) == ("swebench", file_version(path))
    task = instance_task(instance, request)
    assert task.metadata["image"] == "swebench/sweb.eval.x86_64.t_1776_calc-gold:latest"
    assert (task.source, task.source_version) == ("swebench", file_version(path))
    assert task.reward.tests is not None and task.reward.tests.fail_to_pass == [ADD, ADD_ZERO]


def test_swegym_rows_get_swegyms_images(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gym.jsonl", [swegym_row("GOLD")])
    [request] = import_files([path], "swe-gym", source_version="SWE-Gym/SWE-Gym@rev1", job="j").requests
    [instance] = request.instances
    assert instance.image_name == "xingyaoww/sweb.eval.x86_64.t_s_calc-gym-gold:latest"
    assert (instance.FAIL_TO_PASS, instance.PASS_TO_PASS) == ([ADD], [SUB])
    assert (instance.source, instance.source_version) == ("swe-gym", "SWE-Gym/SWE-Gym@rev1")


def test_swesmith_rows_start_from_their_bug(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "smith.jsonl", [swesmith_row("GOLD")])
    [request] = import_files([path], job="j").requests
    [instance] = request.instances
    assert instance.base_commit == "1a2b3c4d" and instance.image_name == swesmith_row("GOLD")["image_name"]
    assert (instance.FAIL_TO_PASS, instance.PASS_TO_PASS, instance.test_patch) == ([SUB], [], None)
    task = instance_task(instance, request)
    assert task.sandbox.files[SETUP_PATCH_PATH] == swesmith_row("GOLD")["patch"]
    assert any(SETUP_PATCH_PATH in command for command in task.sandbox.setup)
    with pytest.raises(FormatError, match="needs its patch"):
        import_files([write_jsonl(tmp_path / "bad.jsonl", [{**swesmith_row("GOLD"), "patch": ""}])], "swe-smith",
                     job="j")  # fmt: skip


def test_r2egym_rows_score_the_tests_expected_to_pass(tmp_path: Path) -> None:
    rows = [r2egym_row("GOLD", {"test_flaky (r2e_tests.test_calc.T)": "FAILED"})]
    imported = import_files([write_jsonl(tmp_path / "r2e.jsonl", rows)], job="j", setup=["true"])
    [request] = imported.requests
    [instance] = request.instances
    assert instance.FAIL_TO_PASS == ["test_add (r2e_tests.test_calc.T)", "test_sub (r2e_tests.test_calc.T)"]
    assert instance.base_commit == "a" * 40 and instance.image_name == f"namanjain12/calc_final:{'b' * 40}"
    assert instance.test_command == "bash run_tests.sh" and request.setup[-1] == "true"  # the format's setup first
    assert len(imported.notes) == 1 and "test_flaky" in imported.notes[0]  # reported, never silently dropped
    task = instance_task(instance, request)
    assert task.reward.command == "bash run_tests.sh" and "r2e_tests/test_calc.py" in task.reward.restore


def test_the_command_writes_one_body_per_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [swebench_row("GOLD"), swesmith_row("GOLD"), r2egym_row("GOLD")])
    out = tmp_path / "bodies.json"
    assert main(["tasks", "import", "swe", str(mixed), "--job", "j", "--template", "calc", "--out", str(out)]) == 0
    bodies = json.loads(out.read_text())
    assert sorted(b["instances"][0]["source"] for b in bodies) == ["r2e-gym", "swe-smith", "swebench"]
    assert all(b["template"] == "calc" and b["job"] == "j" for b in bodies)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "?"}])
    assert main(["tasks", "import", "swe", str(bad), "--job", "j"]) == 2
    assert "unknown row format" in capsys.readouterr().err

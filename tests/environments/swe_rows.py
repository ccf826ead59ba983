"""One row per SWE instance format, with each format's own field names (as published on the
Hugging Face hub: SWE-bench, SWE-Gym, SWE-smith, R2E-Gym), over the calc repository of
tests/sandbox_broker/images_support.py (``add`` subtracts; ``sub`` is right; unittest tests)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from services.sandbox_broker.images.archive import layer_from_dir, write_docker_archive
from services.sandbox_broker.images.sources import ImageConfig
from tests.sandbox_broker.images_support import CALC, CALC_TESTS, calc_repo_image

ADD = "tests.test_calc.T.test_add"
SUB = "test_sub (tests.test_calc.T)"
ADD_ZERO = "test_add_zero (tests.test_calc.T)"  # added by the SWE-bench row's test_patch
TESTS_WITH_ZERO = CALC_TESTS + "\n    def test_add_zero(self):\n        self.assertEqual(add(4, 0), 4)\n"
BROKEN_SUB = CALC.replace("def sub(a, b):\n    return a - b", "def sub(a, b):\n    return b - a")
R2E_TESTS = "#!/bin/sh\npython3 -m unittest -v r2e_tests.test_calc\n"


def diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def swebench_row(mode: str) -> dict[str, Any]:
    return {
        "repo": "t/calc", "instance_id": f"t__calc-{mode.lower()}", "base_commit": "0" * 40,
        "patch": diff("calc.py", CALC, CALC.replace("return a - b", "return a + b", 1)),
        "test_patch": diff("tests/test_calc.py", CALC_TESTS, TESTS_WITH_ZERO),
        "problem_statement": f"MODE-{mode}: add() subtracts", "hints_text": "", "created_at": "2026-01-01T00:00:00Z",
        "version": "1.0", "FAIL_TO_PASS": json.dumps([ADD, ADD_ZERO]), "PASS_TO_PASS": json.dumps([SUB]),
        "environment_setup_commit": "0" * 40,
    }  # fmt: skip


def swegym_row(mode: str) -> dict[str, Any]:
    row = swebench_row(mode)
    row.pop("environment_setup_commit")
    return {**row, "instance_id": f"t__calc-gym-{mode.lower()}", "FAIL_TO_PASS": [ADD], "PASS_TO_PASS": [SUB],
            "test_patch": ""}  # fmt: skip


def swesmith_row(mode: str) -> dict[str, Any]:
    return {
        "instance_id": f"t__calc.1a2b3c4d.func_pm_op_swap__{mode.lower()}", "repo": "swesmith/t__calc.1a2b3c4d",
        "patch": diff("calc.py", CALC, BROKEN_SUB), "FAIL_TO_PASS": [SUB], "PASS_TO_PASS": [],
        "created_at": "2026-01-01", "image_name": "jyangballin/swesmith.x86_64.t_1776_calc.1a2b3c4d",
        "problem_statement": f"MODE-{mode}: sub(5, 3) returns -2",
    }  # fmt: skip


def r2egym_row(mode: str, extra_expected: dict[str, str] | None = None) -> dict[str, Any]:
    expected = {"test_add (r2e_tests.test_calc.T)": "PASSED", "test_sub (r2e_tests.test_calc.T)": "PASSED"}
    commits = {"old_commit_hash": "a" * 40, "new_commit_hash": "b" * 40, "file_diffs": []}
    return {
        "repo_name": "calc", "docker_image": f"namanjain12/calc_final:{'b' * 40}", "commit_hash": "b" * 40,
        "parsed_commit_content": json.dumps(commits), "execution_result_content": json.dumps({"repo_name": "calc"}),
        "modified_files": ["calc.py"], "modified_entity_summaries": [], "relevant_files": [],
        "num_non_test_files": 1, "num_non_test_func_methods": 1, "num_non_test_lines": 1,
        "prompt": "the prompt that wrote the issue (not the task)", "instance_id": f"calc-r2e-{mode.lower()}",
        "problem_statement": f"MODE-{mode}: add() subtracts",
        "expected_output_json": json.dumps({**expected, **(extra_expected or {})}),
    }  # fmt: skip


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def r2e_calc_image(work: Path) -> Path:
    """The calc image with R2E-Gym's layout on top: the tests under /r2e_tests and
    /testbed/run_tests.sh, which runs them."""
    calc_repo_image(work)
    layer = work / "r2e"
    (layer / "r2e_tests").mkdir(parents=True)
    (layer / "r2e_tests" / "__init__.py").write_text("")
    (layer / "r2e_tests" / "test_calc.py").write_text(CALC_TESTS)
    (layer / "testbed").mkdir()
    (layer / "testbed" / "run_tests.sh").write_text(R2E_TESTS)
    layers = [work / "bb" / "l1.tar", work / "repo.tar", layer_from_dir(layer, work / "r2e.tar")]
    out = work / "calc-r2e.tar"
    write_docker_archive(out, layers, ImageConfig(env=("PATH=/usr/bin:/bin",), workdir="/testbed"), "t/calc-r2e:1")
    return out

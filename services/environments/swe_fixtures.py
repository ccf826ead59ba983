"""One row per SWE instance format, with each format's own field names (as published: SWE-bench,
SWE-Gym, SWE-smith, R2E-Gym), over a tiny repository (``calc``: ``add`` subtracts, ``sub`` is
right, unittest tests), and its images on the offline busybox base (fixture_base.py; run with the
host's /usr). Used by the tests and by ``rollout bench envs``; the gold fix makes both functions
right, a no-op leaves them."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from services.environments.fixture_base import busybox_base
from services.sandbox_broker.images.archive import layer_from_dir, write_docker_archive
from services.sandbox_broker.images.sources import ImageConfig

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = CALC.replace("return a - b", "return a + b", 1)
CALC_TESTS = (
    "import unittest\n\nfrom calc import add, sub\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_sub(self):\n        self.assertEqual(sub(5, 3), 2)\n"
)
ADD = "tests.test_calc.T.test_add"
SUB = "test_sub (tests.test_calc.T)"
ADD_ZERO = "test_add_zero (tests.test_calc.T)"  # added by the SWE-bench row's test_patch
TESTS_WITH_ZERO = CALC_TESTS + "\n    def test_add_zero(self):\n        self.assertEqual(add(4, 0), 4)\n"
BROKEN_SUB = CALC.replace("def sub(a, b):\n    return a - b", "def sub(a, b):\n    return b - a")
R2E_RUN_TESTS = "#!/bin/sh\npython3 -m unittest -v r2e_tests.test_calc\n"
TEST_COMMAND = "python3 -m unittest -v {files}"  # the route's test_command for these rows
# the route grades in a fresh sandbox from the agent's diff: the repository must be a git repository
GIT_INIT = "git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base"


def diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def swebench_row(mode: str) -> dict[str, Any]:
    return {
        "repo": "t/calc", "instance_id": f"t__calc-{mode.lower()}", "base_commit": "0" * 40,
        "patch": diff("calc.py", CALC, FIXED), "test_patch": diff("tests/test_calc.py", CALC_TESTS, TESTS_WITH_ZERO),
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


ROWS = {"swebench": swebench_row, "swe-gym": swegym_row, "swe-smith": swesmith_row, "r2e-gym": r2egym_row}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def calc_images(work: Path) -> dict[str, Path]:
    """``calc``: the base, then /testbed (calc.py, tests/); ``calc-r2e``: R2E-Gym's layout on top
    (the tests under /r2e_tests, /testbed/run_tests.sh running them). docker save tars."""
    busybox_base(work / "base")  # its one layer is the images' first
    repo, r2e = work / "repo", work / "r2e"
    (repo / "testbed" / "tests").mkdir(parents=True)
    (repo / "testbed" / "calc.py").write_text(CALC)
    (repo / "testbed" / "tests" / "__init__.py").write_text("")
    (repo / "testbed" / "tests" / "test_calc.py").write_text(CALC_TESTS)
    (r2e / "r2e_tests").mkdir(parents=True)
    (r2e / "r2e_tests" / "__init__.py").write_text("")
    (r2e / "r2e_tests" / "test_calc.py").write_text(CALC_TESTS)
    (r2e / "testbed").mkdir()
    (r2e / "testbed" / "run_tests.sh").write_text(R2E_RUN_TESTS)
    layers = [work / "base" / "base-layer.tar", layer_from_dir(repo, work / "repo.tar")]
    config = ImageConfig(env=("PATH=/usr/local/bin:/usr/bin:/bin",), workdir="/testbed", user="root")
    images = {"calc": work / "calc.tar", "calc-r2e": work / "calc-r2e.tar"}
    write_docker_archive(images["calc"], layers, config, "rollout/calc:1")
    write_docker_archive(images["calc-r2e"], [*layers, layer_from_dir(r2e, work / "r2e.tar")], config, "rollout/calc:2")
    return images

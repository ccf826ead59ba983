"""The task builder's own pytest runs (gold and bugged code) see none of the caller's pytest options:
a ``PYTEST_ADDOPTS`` naming a plugin the task cannot import made every run report nothing, and every
recipe was refused as "the injected bug makes no test fail". A run that reports no test says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.taskbuild.builder import _run_tests
from services.taskbuild.recipe import TaskRecipe


def recipe(test_file: str) -> TaskRecipe:
    return TaskRecipe(task_id="t", package="p==1", file="m.py", old="1", new="2", test_file=test_file, problem="")


def test_the_callers_pytest_options_do_not_reach_the_builders_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.py").write_text("X = 1\n")
    (tmp_path / "test_m.py").write_text(
        "import m\n\ndef test_one():\n    assert m.X == 1\n\ndef test_two():\n    assert m.X == 2\n"
    )
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no_such_plugin_here")
    monkeypatch.setenv("PYTEST_PLUGINS", "no_such_plugin_either")
    assert _run_tests(tmp_path, recipe("test_m.py")) == {
        "test_m.py::test_one": "PASSED",
        "test_m.py::test_two": "FAILED",
    }


def test_a_run_that_reports_no_test_is_an_error_with_pytests_output(tmp_path: Path) -> None:
    (tmp_path / "test_m.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(ValueError, match=r"(?s)t: pytest reported no test \(exit 2\): .*not_a_module_anywhere"):
        _run_tests(tmp_path, recipe("test_m.py"))

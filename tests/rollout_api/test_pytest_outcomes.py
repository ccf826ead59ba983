"""Per-test statuses from a real pytest run, read both ways: the grader's plugin report and the log.

The run covers what a scraper gets wrong: a unittest ``subTest`` and a ``subtests`` fixture that
fail while pytest still prints ``PASSED`` for the test, a teardown error after a pass, a setup
error, xfail and xpass, parametrized ids with a space and with ``::``, and a test that never ran.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.protocol import ScoredTests
from services.rollout_api.worker import outcomes
from services.rollout_api.worker.reward import PLUGIN, PLUGIN_SOURCE, with_plugin

TESTS = """
import unittest
import pytest

class LastTests(unittest.TestCase):
    def test_default(self):
        for value in ([], None):
            with self.subTest(args=(value,)):
                self.assertEqual(value, [])

    def test_good(self):
        with self.subTest(i=1):
            self.assertTrue(True)

def test_fixture_subtests(subtests):
    for i in range(2):
        with subtests.test(i=i):
            assert i == 0

@pytest.mark.parametrize("v", ["a b", "c::d"])
def test_param(v):
    assert v

@pytest.mark.xfail
def test_xfail():
    assert 0

@pytest.mark.xfail
def test_xpass():
    pass

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown")

def test_teardown(bad_teardown):
    pass

@pytest.fixture
def bad_setup():
    raise RuntimeError("setup")

def test_setup(bad_setup):
    pass
"""

EXPECTED = {
    "test_it.py::LastTests::test_default": "FAILED",  # only a subtest failed; pytest also prints PASSED
    "test_it.py::LastTests::test_good": "PASSED",
    "test_it.py::test_fixture_subtests": "FAILED",
    "test_it.py::test_param[a b]": "PASSED",
    "test_it.py::test_param[c::d]": "PASSED",
    "test_it.py::test_xfail": "XFAIL",
    "test_it.py::test_xpass": "PASSED",
    "test_it.py::test_teardown": "ERROR",
    "test_it.py::test_setup": "ERROR",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(the log, the plugin's report) of one real ``pytest -rA`` run, as the reward command runs it."""
    work = tmp_path_factory.mktemp("pytest-run")
    (work / "test_it.py").write_text(TESTS)
    grader = work / "grader"
    grader.mkdir()
    (grader / f"{PLUGIN}.py").write_bytes(PLUGIN_SOURCE)
    report = work / "report.jsonl"
    command = with_plugin(f"{sys.executable} -m pytest -rA test_it.py", str(report), str(grader))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTEST_ADDOPTS": "-q"}  # the task's own addopts kept
    done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout + done.stderr, report.read_text()


def test_the_plugin_report_gives_every_status_as_pytest_decided_it(run: tuple[str, str]) -> None:
    _, report = run
    assert outcomes.parse_report(report) == EXPECTED
    assert '"finished": 1' in report


def test_the_log_reads_a_failed_subtest_as_a_failed_test(run: tuple[str, str]) -> None:
    """The old parser let the last summary line win and skipped ``SUBFAILED`` lines: it read
    ``LastTests::test_default`` as PASSED, so a no-op scored 1.0 on a task whose failing test
    used ``subTest``."""
    log, _ = run
    assert "SUBFAILED" in log and "PASSED test_it.py::LastTests::test_default" in log
    statuses = outcomes.parse(log, "pytest")
    assert {k: statuses.get(k) for k in EXPECTED} == EXPECTED


def test_a_named_test_that_did_not_run_is_missing_and_fails(run: tuple[str, str]) -> None:
    statuses = outcomes.parse_report(run[1])
    tests = ScoredTests(fail_to_pass=["test_it.py::LastTests::test_good"], pass_to_pass=["test_it.py::test_gone"])
    assert outcomes.grade(statuses, tests) == (
        False,
        {"test_it.py::LastTests::test_good": "PASSED", "test_it.py::test_gone": "MISSING"},
    )
    subtest = ScoredTests(fail_to_pass=["test_it.py::LastTests::test_default"])
    assert outcomes.grade(statuses, subtest)[0] is False


def test_a_report_cut_short_keeps_what_it_has() -> None:
    report = '{"started": true}\n{"id": "t.py::a", "when": "call", "outcome": "passed"}\n{"id": "t.py::b", "wh'
    assert outcomes.parse_report(report) == {"t.py::a": "PASSED"}

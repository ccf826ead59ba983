"""Per-test outcomes parsed from pytest, unittest and Django logs, and the SWE-bench grading."""

from __future__ import annotations

from services.protocol import ScoredTests
from services.rollout_api.worker.outcomes import grade, parse

PYTEST = """\
tests/test_a.py::test_ok PASSED                                          [ 25%]
tests/test_a.py::test_bad FAILED                                         [ 50%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::test_param[1-2]
SKIPPED [1] tests/test_a.py:9: no network
XFAIL tests/test_a.py::test_xf - known
FAILED tests/test_a.py::test_bad - AssertionError: 1 != 2
ERROR tests/test_b.py - SyntaxError: invalid syntax
"""

UNITTEST = """\
test_add (tests.test_calc.T.test_add) ... FAIL
test_sub (tests.test_calc.T.test_sub) ... ok
test_skip (tests.test_calc.T.test_skip) ... skipped 'later'
======================================================================
FAIL: test_add (tests.test_calc.T.test_add)
"""

DJANGO = """\
test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok
test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ERROR
"""


def test_pytest_summary_and_progress_lines() -> None:
    statuses = parse(PYTEST, "pytest")
    assert statuses["tests/test_a.py::test_ok"] == "PASSED"
    assert statuses["tests/test_a.py::test_param[1-2]"] == "PASSED"
    assert statuses["tests/test_a.py::test_bad"] == "FAILED"
    assert statuses["tests/test_a.py::test_xf"] == "XFAIL"
    assert statuses["tests/test_b.py"] == "ERROR"  # a collection error names the file


def test_unittest_and_django_ids_in_every_spelling() -> None:
    statuses = parse(UNITTEST, "unittest")
    assert statuses["tests.test_calc.T.test_add"] == statuses["test_add (tests.test_calc.T)"] == "FAILED"
    assert statuses["test_sub (tests.test_calc.T.test_sub)"] == "PASSED"
    assert statuses["tests.test_calc.T.test_skip"] == "SKIPPED"
    django = parse(DJANGO, "django")
    assert django["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"] == "PASSED"
    assert django["test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"] == "ERROR"


def test_resolved_only_when_every_named_test_is_right() -> None:
    statuses = parse(PYTEST + UNITTEST, "auto")
    ok = ScoredTests(fail_to_pass=["tests/test_a.py::test_ok"], pass_to_pass=["tests.test_calc.T.test_skip"])
    assert grade(statuses, ok) == (
        True,
        {"tests/test_a.py::test_ok": "PASSED", "tests.test_calc.T.test_skip": "SKIPPED"},
    )
    assert grade(statuses, ScoredTests(fail_to_pass=["tests.test_calc.T.test_skip"]))[0] is False  # F2P skipped
    missing = grade(statuses, ScoredTests(fail_to_pass=["tests/test_a.py::test_ok"], pass_to_pass=["nope"]))
    assert missing == (False, {"tests/test_a.py::test_ok": "PASSED", "nope": "MISSING"})
    assert grade(statuses, ScoredTests(fail_to_pass=["tests/test_a.py::test_bad"]))[0] is False

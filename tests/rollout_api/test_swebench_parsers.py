"""``tests.log_parser: "swebench"``: the official ``swebench`` package's log parser named by the
instance (SWE-bench 5.x rows' ``log_parser``) reads the log where pytest's report is missing. The
package is optional (``pip install '.[swebench]'``): without it scoring is an infra error, never a
guess; the tests that run its parsers are skipped where it is not installed."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from pydantic import ValidationError

from services.protocol import InfraStage, ScoredTests
from services.protocol.swebench import SweBenchRolloutRequest, SweInstance
from services.rollout_api.swebench import instance_task
from services.rollout_api.worker import outcomes, reward, swebench_parsers
from services.rollout_api.worker.clients import InfraError

ROW = {"instance_id": "django__django-1", "repo": "django/django", "base_commit": "abc",
       "problem_statement": "p", "FAIL_TO_PASS": ["test_a (m.T)"], "PASS_TO_PASS": ["test_b (m.T)"]}  # fmt: skip
DJANGO_LOG = """test_a (m.T) ... FAIL
test_b (m.T) ... ok
test_c (m.T) ... skipped 'no db'

======================================================================
FAIL: test_a (m.T)
----------------------------------------------------------------------
AssertionError
"""


def test_the_parser_is_named_by_each_instance_and_only_with_log_parser_swebench() -> None:
    with pytest.raises(ValidationError, match="swebench_parser"):
        ScoredTests(fail_to_pass=["t"], log_parser="swebench")
    with pytest.raises(ValidationError, match="swebench_parser"):
        ScoredTests(fail_to_pass=["t"], swebench_parser="parse_log_django")
    with pytest.raises(ValidationError, match="swebench_parser"):
        ScoredTests(fail_to_pass=["t"], log_parser="swebench", swebench_parser="import os")
    with pytest.raises(ValidationError, match="missing"):
        SweBenchRolloutRequest(job="j", instances=[SweInstance(**ROW)], log_parser="swebench")
    row = SweInstance(**ROW, log_parser="parse_log_django")
    task = instance_task(row, SweBenchRolloutRequest(job="j", instances=[row], log_parser="swebench"))
    assert task.reward.tests is not None
    assert (task.reward.tests.log_parser, task.reward.tests.swebench_parser) == ("swebench", "parse_log_django")
    plain = instance_task(row, SweBenchRolloutRequest(job="j", instances=[row]))
    assert plain.reward.tests is not None and plain.reward.tests.swebench_parser is None  # the row's column unused
    assert "swebench" in reward.REPORTED  # pytest still runs with the grader's report plugin: it wins where it exists


def test_without_the_package_scoring_is_an_infra_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str, *args: Any) -> Any:
        raise ImportError(f"No module named {name!r}")

    swebench_parsers._registry.cache_clear()
    monkeypatch.setattr(importlib, "import_module", missing)
    try:
        with pytest.raises(InfraError) as caught:
            reward._swebench(DJANGO_LOG, "parse_log_django")
        assert caught.value.stage is InfraStage.REWARD and "not installed" in str(caught.value)
    finally:
        swebench_parsers._registry.cache_clear()


def test_the_official_parsers_read_the_log() -> None:
    pytest.importorskip("swebench.harness.log_parsers")
    statuses = swebench_parsers.parse(DJANGO_LOG, "parse_log_django")
    assert statuses["test_a (m.T)"] == "FAILED" and statuses["test_b (m.T)"] == "PASSED"
    tests = ScoredTests(fail_to_pass=["test_a (m.T)"], pass_to_pass=["test_b (m.T)"], log_parser="swebench",
                        swebench_parser="parse_log_django")  # fmt: skip
    assert outcomes.grade(statuses, tests) == (False, {"test_a (m.T)": "FAILED", "test_b (m.T)": "PASSED"})
    fixed = swebench_parsers.parse(DJANGO_LOG.replace("... FAIL", "... ok"), "parse_log_django")
    assert outcomes.grade(fixed, tests)[0] is True
    pytest_log = "PASSED tests/test_x.py::test_a\nFAILED tests/test_x.py::test_b - assert 1 == 2\n"
    assert swebench_parsers.parse(pytest_log, "parse_log_pytest") == outcomes.parse(pytest_log, "pytest")
    with pytest.raises(swebench_parsers.Unavailable, match="no log parser"):
        swebench_parsers.parse(DJANGO_LOG, "parse_log_nonexistent")

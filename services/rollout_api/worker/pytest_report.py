"""The grader's pytest plugin: written into the sandbox at scoring time and loaded with ``-p``.

It records every test report pytest makes (setup, call, teardown, subtests, collection errors) as
one JSON line in the file ``ROLLOUT_PYTEST_REPORT`` names (a fresh random path per scoring), and a
last line when the session finishes. The worker turns these into per-test statuses
(``outcomes.parse_report``): structured, so nothing printed by the code under test is read as a
result. Runs under the sandbox's own Python and pytest: standard library only, syntax of 3.6.
"""

import json
import os
from typing import IO, Any  # noqa: F401 (used by the type comments: this file runs on Python 3.6 too)

_state = {}  # type: dict[str, IO[str]]


def pytest_configure(config):  # type: (Any) -> None
    path = os.environ.pop("ROLLOUT_PYTEST_REPORT", None)  # not left for the code under test to find
    if path and "out" not in _state and not hasattr(config, "workerinput"):  # xdist: the controller writes
        _state["out"] = open(path, "w")  # noqa: SIM115 (open for the whole session)
        _write({"started": True})


def pytest_collectreport(report):  # type: (Any) -> None
    if report.failed:
        _write({"id": report.nodeid, "when": "collect", "outcome": "failed"})


def pytest_runtest_logreport(report):  # type: (Any) -> None
    _write({
        "id": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"),
        "sub": hasattr(report, "context"),  # a subtest (pytest >= 9, or the pytest-subtests plugin)
    })  # fmt: skip


def pytest_sessionfinish(session, exitstatus):  # type: (Any, Any) -> None
    _write({"finished": int(exitstatus)})


def _write(record):  # type: (dict[str, Any]) -> None
    out = _state.get("out")
    if out is not None:
        out.write(json.dumps(record) + "\n")
        out.flush()

"""Per-test outcomes from a test runner's log, and the SWE-bench decision on them.

Where pytest runs with the grader's plugin (``pytest_report``), its structured report is the source
(:func:`parse_report`): setup/teardown errors, subtests, xfail/xpass and any parametrized id, exactly
as pytest decided them. Without it, the log is read as the official harness reads it
(``swebench/harness/log_parsers``): pytest's ``-rA`` summary (``PASSED id``, ``FAILED id - msg``,
``SUBFAILED[(context)] id - msg``) and verbose lines (``id PASSED``); unittest and Django's
``name (module.Class) ... ok|FAIL|ERROR|skipped`` lines with ``FAIL:``/``ERROR:`` headers.
A failure is final: a test with a failed subtest or a teardown error is not a pass because pytest
also printed ``PASSED`` for it. (Before, the last line won and ``SUBFAILED`` lines were not read,
so a test whose only failures were subtests was PASSED.)
Grading follows swebench 5.x: a test passes when PASSED or XFAIL; a FAIL_TO_PASS test must pass
(skipped counts as a failure); a PASS_TO_PASS test must not fail (skipped counts as kept).
"""

from __future__ import annotations

import json
import re

from services.protocol import ScoredTests

PASSED, FAILED, ERROR, SKIPPED, XFAIL, MISSING = "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "MISSING"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PYTEST_STATUS = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
_PYTEST_FIRST = re.compile(rf"^({_PYTEST_STATUS}) (.+?)(?: - .*)?$")
_PYTEST_SUB = re.compile(r"^SUB(FAIL|PASS|SKIP|XFAIL|XPASS)\w*(?:\(.*?\))? (\S+::\S+)")
_PYTEST_LAST = re.compile(rf"^(\S+::\S+) ({_PYTEST_STATUS})(?:\s+\[\s*\d+%\])?$")
_UNITTEST = re.compile(r"^(\w+) \(([\w.]+)\)(?:\n.*?)? \.\.\. (ok|OK|FAIL|ERROR|skipped.*|expected failure)$")
_UNITTEST_HEADER = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)")
_UNITTEST_WORD = {"ok": PASSED, "OK": PASSED, "FAIL": FAILED, "ERROR": ERROR, "expected failure": XFAIL}


def parse_pytest(log: str) -> dict[str, str]:
    statuses: dict[str, str] = {}
    for line in _ANSI.sub("", log).splitlines():
        line = line.strip()
        if sub := _PYTEST_SUB.match(line):  # a subtest: only its failure says anything about the test
            if sub.group(1) == "FAIL":
                _worst(statuses, sub.group(2), FAILED)
        elif first := _PYTEST_FIRST.match(line):  # the -rA summary
            _worst(statuses, first.group(2), _pytest_word(first.group(1)))
        elif last := _PYTEST_LAST.match(line):  # -v progress lines
            statuses.setdefault(last.group(1), _pytest_word(last.group(2)))
    return statuses


def _worst(statuses: dict[str, str], test_id: str, status: str) -> None:
    """A failure or error is never overwritten by a pass, skip or xfail of the same id."""
    if statuses.get(test_id) not in (FAILED, ERROR) or status in (FAILED, ERROR):
        statuses[test_id] = status


def parse_report(report: str) -> dict[str, str]:
    """Statuses from the grader's pytest plugin: FAILED if the call or any subtest failed, ERROR if
    setup or teardown failed (or the file did not collect), XFAIL, SKIPPED, else PASSED (an
    unexpected pass, XPASS, counts as passed, as in ``-rA``'s ``XPASS``)."""
    statuses: dict[str, str] = {}
    failed_subtests: set[str] = set()
    for line in report.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if not isinstance(record, dict) or not isinstance(test_id := record.get("id"), str):
            continue
        outcome, when = record.get("outcome"), record.get("when")
        if record.get("sub"):
            if outcome == "failed":
                failed_subtests.add(test_id)
        elif outcome == "failed":
            _worst(statuses, test_id, FAILED if when == "call" else ERROR)
        elif outcome == "skipped":
            _worst(statuses, test_id, XFAIL if record.get("xfail") else SKIPPED)
        elif when == "call":
            _worst(statuses, test_id, PASSED)
    for test_id in failed_subtests:
        statuses[test_id] = FAILED
    return statuses


def _pytest_word(word: str) -> str:
    return PASSED if word == "XPASS" else word


def parse_unittest(log: str) -> dict[str, str]:
    """unittest and Django test runner output (``--verbosity 2``)."""
    statuses: dict[str, str] = {}
    for line in _ANSI.sub("", log).splitlines():
        line = line.rstrip()
        if m := _UNITTEST.match(line):
            word = m.group(3)
            status = SKIPPED if word.startswith("skipped") else _UNITTEST_WORD[word]
            _record(statuses, m.group(1), m.group(2), status)
        elif h := _UNITTEST_HEADER.match(line):
            _record(statuses, h.group(2), h.group(3), FAILED if h.group(1) == "FAIL" else ERROR)
    return statuses


def _record(statuses: dict[str, str], name: str, where: str, status: str) -> None:
    """Under every id a dataset may use: ``name (module.Class)``, and ``module.Class.name``."""
    where = where.removesuffix(f".{name}")  # Python >= 3.11 prints (module.Class.name)
    for key in (f"{name} ({where})", f"{where}.{name}", f"{name} ({where}.{name})"):
        if statuses.get(key) not in (FAILED, ERROR):  # a FAIL: header after "... ok" never upgrades
            statuses[key] = status


PARSERS = {"pytest": (parse_pytest,), "unittest": (parse_unittest,), "django": (parse_unittest,),
           "auto": (parse_pytest, parse_unittest)}  # fmt: skip


def parse(log: str, parser: str) -> dict[str, str]:
    statuses: dict[str, str] = {}
    for parse_one in PARSERS[parser]:
        statuses.update(parse_one(log))
    return statuses


def grade(statuses: dict[str, str], tests: ScoredTests) -> tuple[bool, dict[str, str]]:
    """(resolved, the status of every named test)."""
    named = {t: statuses.get(t, MISSING) for t in [*tests.fail_to_pass, *tests.pass_to_pass]}
    fixed = all(named[t] in (PASSED, XFAIL) for t in tests.fail_to_pass)
    kept = all(named[t] in (PASSED, XFAIL, SKIPPED) for t in tests.pass_to_pass)
    return fixed and kept, named

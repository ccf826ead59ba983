"""R2E-Gym rows (``R2E-Gym/R2E-Gym-Subset``, ``-Lite``): ``repo_name``, ``docker_image``,
``commit_hash``, ``parsed_commit_content`` (JSON: ``old_commit_hash``, ``new_commit_hash``,
``file_diffs``), ``problem_statement``, ``expected_output_json`` (JSON: test -> status).

R2E-Gym's image holds the repository at ``/testbed`` (before the fix), its tests under
``/r2e_tests`` and ``/testbed/run_tests.sh``, which runs them; its reward is 1 when every test's
parsed status equals ``expected_output_json``. Mapped: the tests expected to pass must pass (the row
does not say which of them failed before the fix, so they are all ``FAIL_TO_PASS`` unless the row
has its own ``FAIL_TO_PASS`` / ``PASS_TO_PASS``); the tests are copied into ``/testbed/r2e_tests``
before the agent starts (where R2E-Gym's runtime links them) and restored before scoring. A test
expected to fail or be skipped cannot be scored by the route: :func:`unscored` names them, and the
importer reports them."""

from __future__ import annotations

import json
from typing import Any

from services.protocol.swebench import SweInstance

SOURCE = "r2e-gym"
FIELDS = ("repo_name", "docker_image", "commit_hash", "problem_statement", "expected_output_json")
PASSED = "PASSED"
SETUP = "if [ -d /r2e_tests ] && [ ! -e r2e_tests ]; then cp -r /r2e_tests r2e_tests; fi"
TEST_COMMAND = "bash run_tests.sh"


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value else value or {}


def expected(row: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in _json(row.get("expected_output_json")).items()}


def unscored(row: dict[str, Any]) -> dict[str, str]:
    """Tests whose expected status is not PASSED (R2E-Gym requires that status; the route cannot)."""
    return {test: status for test, status in expected(row).items() if status != PASSED}


def instance_id(row: dict[str, Any]) -> str:
    return str(row.get("instance_id") or f"{row.get('repo_name')}-{str(row.get('commit_hash', ''))[:12]}")


def instance(row: dict[str, Any], source_version: str) -> SweInstance:
    passing = sorted(test for test, status in expected(row).items() if status == PASSED)
    commit = _json(row.get("parsed_commit_content")).get("old_commit_hash") or row.get("commit_hash")
    return SweInstance.model_validate({
        "instance_id": instance_id(row), "repo": row.get("repo_name"), "base_commit": commit,
        "problem_statement": row.get("problem_statement"), "image_name": row.get("docker_image"),
        "FAIL_TO_PASS": row.get("FAIL_TO_PASS") or passing, "PASS_TO_PASS": row.get("PASS_TO_PASS") or [],
        "test_command": TEST_COMMAND, "source": SOURCE, "source_version": source_version,
    })  # fmt: skip


def request_defaults() -> dict[str, Any]:
    return {"setup": [SETUP]}

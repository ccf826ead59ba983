"""SWE-bench rows (``princeton-nlp/SWE-bench``, ``_Lite``, ``_Verified``): the SWE route's own field
names. ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` are JSON strings in the published datasets and lists in
some copies; both are read. The image is SWE-bench's evaluation image for the instance (the route's
``image_pattern``), unless the row names one."""

from __future__ import annotations

from typing import Any

from services.protocol.swebench import SweInstance

SOURCE = "swebench"
FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")


def instance(row: dict[str, Any], source_version: str) -> SweInstance:
    return SweInstance.model_validate({**row, "source": SOURCE, "source_version": source_version})


def request_defaults() -> dict[str, Any]:
    """Options of the route's request for a file of these rows (the route's own defaults)."""
    return {}

"""SWE-Gym rows (``SWE-Gym/SWE-Gym``, ``SWE-Gym/SWE-Gym-Lite``): SWE-bench's schema (``instance_id``,
``repo``, ``base_commit``, ``patch``, ``test_patch``, ``problem_statement``, ``version``,
``FAIL_TO_PASS``, ``PASS_TO_PASS``, as lists). What differs is the image set: SWE-Gym's evaluation
images are ``xingyaoww/sweb.eval.x86_64.<id>`` with ``__`` written ``_s_`` (SWE-bench writes
``_1776_``). The rows cannot be told from SWE-bench's by their fields: name the format."""

from __future__ import annotations

from typing import Any

from services.protocol.swebench import SweInstance

SOURCE = "swe-gym"
FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")


def image_name(instance_id: str) -> str:
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}:latest".lower()


def instance(row: dict[str, Any], source_version: str) -> SweInstance:
    image = row.get("image_name") or image_name(str(row.get("instance_id", "")))
    return SweInstance.model_validate({**row, "image_name": image, "source": SOURCE, "source_version": source_version})


def request_defaults() -> dict[str, Any]:
    return {}

"""SWE-smith rows (``SWE-bench/SWE-smith``): ``instance_id``, ``repo``
(``swesmith/<owner>__<name>.<commit>``), ``patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists),
``image_name``, ``problem_statement``.

SWE-smith's image holds the repository clean, at the commit the ``repo`` name ends with; the row's
``patch`` is the bug (SWE-smith's harness checks out a branch with it applied). So the patch is
applied and committed before the agent's first turn (``setup_patch``), and the fix is its reverse.
There is no ``test_patch``: the tests that decide the reward are already in the image."""

from __future__ import annotations

from typing import Any

from services.protocol.swebench import SweInstance

SOURCE = "swe-smith"
FIELDS = ("instance_id", "repo", "patch", "image_name", "problem_statement", "FAIL_TO_PASS")


def base_commit(repo: str) -> str:
    """``swesmith/getmoto__moto.694ce1f4`` -> ``694ce1f4`` (the mirror's name ends with the commit)."""
    name = repo.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1] if "." in name else "HEAD"


def instance(row: dict[str, Any], source_version: str) -> SweInstance:
    if not row.get("patch"):
        raise ValueError(f"{row.get('instance_id')}: a SWE-smith row needs its patch (the bug to start from)")
    mapped = {**row, "setup_patch": row["patch"], "test_patch": None, "source": SOURCE}
    mapped["source_version"] = source_version
    mapped.setdefault("base_commit", base_commit(str(row.get("repo", ""))))
    return SweInstance.model_validate(mapped)


def request_defaults() -> dict[str, Any]:
    return {}

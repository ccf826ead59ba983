"""SWE-bench / SWE-smith style instances, as submitted to ``POST /rollouts/swebench``.

The rollout API maps each instance onto a :class:`~services.protocol.tasks.Task` (a sandbox
template, setup, and a reward command that runs the instance's tests); workers only see Tasks.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.protocol.fields import Name, SourceVersion
from services.protocol.tasks import RolloutOptions


class SweInstance(BaseModel):
    """One row of a SWE-bench / SWE-smith dataset (extra columns are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: Name
    repo: str  # "owner/name"
    base_commit: str = Field(min_length=1)
    problem_statement: str = Field(min_length=1)
    FAIL_TO_PASS: list[str] = Field(min_length=1)  # tests the fix must make pass
    PASS_TO_PASS: list[str] = Field(default_factory=list)  # tests that must keep passing
    image_name: str | None = None  # the instance's container image (SWE-smith: ``image_name``)
    test_patch: str | None = None  # applied fresh before the tests run (SWE-bench)
    env: dict[str, str] = Field(default_factory=dict)  # for every command of the episode and the reward
    # applied (and committed, in a git repository) before the agent's first turn: the bug of a
    # SWE-smith row, whose image holds the clean repository
    setup_patch: str | None = None
    # this instance's test command, placeholders as in the request's (nothing appended); else the request's
    test_command: str | None = None
    # the official harness's parser of this row's log (SWE-bench 5.x: "parse_log_django", ...): used
    # when the request's ``log_parser`` is "swebench"
    log_parser: str | None = None
    source: Name = "swebench"  # the dataset format the row came from (docs/environments.md)
    source_version: SourceVersion = ""  # that dataset's version (a name, a revision or a content hash)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """The Hugging Face datasets store these lists as JSON strings."""
        return json.loads(value) if isinstance(value, str) else value


class SweBenchRolloutRequest(RolloutOptions):
    """``POST /rollouts/swebench``: the options of ``RolloutRequest``, with instances instead of tasks."""

    instances: list[SweInstance] = Field(min_length=1)
    template: Name | None = None  # broker template for every instance; default: derived from its image
    # the instance's image when the row has no ``image_name``: SWE-bench's own naming (lower-cased
    # id; with a namespace, "__" becomes "_1776_"); the template is named after the image
    image_pattern: str = "swebench/sweb.eval.x86_64.{instance_id}:latest"
    repo_dir: str = "/testbed"  # where the repository is inside the image; every command starts here
    env: dict[str, str] = Field(default_factory=dict)  # for every instance (its own ``env`` wins)
    setup: list[str] = Field(default_factory=list)  # run before the agent's first turn
    # {files}: the test files (the test_patch's, else those of the test ids); {ids}: the test ids;
    # {modules}: the test files as dotted modules (Django's runtests.py). No placeholder: ids appended
    test_command: str = "python -m pytest -rA {files}"
    # swebench: each instance's own ``log_parser`` (a SWE-bench 5.x column) from the official package
    log_parser: Literal["auto", "pytest", "unittest", "django", "swebench"] = "auto"
    reward_timeout_s: float = Field(1_800.0, gt=0)
    grade_in: Literal["fresh", "same"] = "fresh"  # the tests run in a new sandbox with the agent's diff
    hide_history: bool = True  # after ``setup``: the repository keeps only its base commit (no later objects)

    @model_validator(mode="after")
    def _parsers_named(self) -> SweBenchRolloutRequest:
        if self.log_parser == "swebench":
            missing = [i.instance_id for i in self.instances if not i.log_parser]
            if missing:
                raise ValueError(f"log_parser 'swebench' needs each instance's log_parser; missing: {missing[:5]}")
        return self

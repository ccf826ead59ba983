"""The SWE instance rows of the tests: services/environments/swe_fixtures.py (shared with
``rollout bench envs``)."""

from services.environments.swe_fixtures import (
    ADD,
    ADD_ZERO,
    GIT_INIT,
    ROWS,
    SUB,
    TEST_COMMAND,
    calc_images,
    r2egym_row,
    swebench_row,
    swegym_row,
    swesmith_row,
    write_jsonl,
)

__all__ = ["ADD", "ADD_ZERO", "GIT_INIT", "ROWS", "SUB", "TEST_COMMAND", "calc_images", "r2egym_row", "swebench_row",
           "swegym_row", "swesmith_row", "write_jsonl"]  # fmt: skip

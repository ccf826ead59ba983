"""The Harbor fixture set (tests/environments/harbor_tasks: Terminal-Bench-style tasks written for
these tests); its ``FROM ubuntu:24.04`` maps to the busybox base of services/environments/fixture_base.py."""

from __future__ import annotations

from pathlib import Path

from services.environments.fixture_base import HARBOR_FIXTURES, busybox_base

TASKS = HARBOR_FIXTURES
__all__ = ["TASKS", "busybox_base", "task_dirs"]


def task_dirs() -> list[Path]:
    return sorted(p for p in TASKS.iterdir() if (p / "task.toml").is_file())

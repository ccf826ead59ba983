"""Real CLI harnesses from npm for the gateway's dialect tests (``services/benchmarks/npm_harness.py``,
shared with ``rollout bench agents``): a test that needs one is skipped, saying why, where npm is
missing or cannot install the package in time. The tests allow 240 s each."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.benchmarks.npm_harness import HarnessUnavailable
from services.benchmarks.npm_harness import npm_binary as install


def npm_binary(package: str, version: str, binary: str) -> Path:
    try:
        return install(package, version, binary)
    except HarnessUnavailable as e:
        pytest.skip(str(e))

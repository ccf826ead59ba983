"""Printing and saving benchmark figures."""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def write_json(path: Path | None, figures: Mapping[str, Any]) -> None:
    """Write ``figures`` plus host facts to ``path`` (if given)."""
    if path is None:
        return
    doc = {
        **figures,
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": _cpus()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {path}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))

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


def print_table(title: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """A plain aligned table; floats get three significant decimals."""
    if not rows:
        print(f"{title}: no rows")
        return
    columns = list(rows[0].keys())
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


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

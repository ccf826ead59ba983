"""A plain aligned text table, printed by the benchmarks and the fleet launcher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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

"""Tail figures from raw episode data: plain functions, unit-tested."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None when there are no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def tail_share(created_at: float, t90: float | None, last_finish: float | None) -> float | None:
    """Share of a rollout's time spent after 90% of its trajectories finished."""
    if t90 is None or last_finish is None or last_finish <= created_at:
        return None
    return max(0.0, last_finish - t90) / (last_finish - created_at)


def rate_per_hour(finish_times: Sequence[float]) -> float | None:
    """Finishes per hour over the span of ``finish_times`` (None below two points)."""
    if len(finish_times) < 2:
        return None
    span = max(finish_times) - min(finish_times)
    return (len(finish_times) - 1) / span * 3600.0 if span > 0 else None


def ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None

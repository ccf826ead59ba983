"""The call path's metrics, added up in plain numbers and written to Prometheus in bulk.

With several worker processes each Prometheus value lives in a shared-memory file, and every
increment takes a lock, checks the pid and packs the value into that file: about 3 us, ten of
them per call (counters, two histograms, the in-flight gauge up and down). The tally adds to a
dict instead and writes each changed value once per ``FLUSH_S`` and whenever this process renders
``/metrics``; the per-engine in-flight gauge is set from the engines' own counts at the same
moments. So a scrape may see another process's calls up to ``FLUSH_S`` late; none is lost.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable, Mapping

from prometheus_client import Counter, Gauge, Histogram

FLUSH_S = 0.5


class _Pending:
    """Observations of one histogram child not yet written: a count per bucket and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds  # upper bounds, the last one +Inf
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket with value <= bound, as observe()
        self.total += value


class Tally:
    def __init__(self) -> None:
        self._counts: dict[Counter, float] = {}
        self._observed: dict[Histogram, _Pending] = {}
        self._gauges: dict[str, Gauge] = {}  # in-flight children by engine id, last flush's set
        self._in_flight: Callable[[], Mapping[str, int]] | None = None
        self._gauge_of: Callable[[str], Gauge] | None = None

    def count(self, child: Counter, amount: float = 1.0) -> None:
        self._counts[child] = self._counts.get(child, 0.0) + amount

    def observe(self, child: Histogram, value: float) -> None:
        pending = self._observed.get(child)
        if pending is None:
            pending = self._observed[child] = _Pending(child._upper_bounds)
        pending.add(value)

    def watch_in_flight(self, source: Callable[[], Mapping[str, int]], gauge_of: Callable[[str], Gauge]) -> None:
        """Set ``gauge_of(engine)`` to ``source()[engine]`` at every flush (0 once an engine is gone)."""
        self._in_flight, self._gauge_of = source, gauge_of

    def flush(self) -> None:
        counts, self._counts = self._counts, {}
        for counter, amount in counts.items():
            counter.inc(amount)
        observed, self._observed = self._observed, {}
        for histogram, pending in observed.items():
            # prometheus_client has no bulk observe: write what observe() would have, bucket by bucket
            histogram._sum.inc(pending.total)
            for bucket, n in zip(histogram._buckets, pending.counts, strict=True):
                if n:
                    bucket.inc(n)
        self._flush_in_flight()

    def _flush_in_flight(self) -> None:
        if self._in_flight is None or self._gauge_of is None:
            return
        now = self._in_flight()
        for engine in self._gauges.keys() - now.keys():
            self._gauges.pop(engine).set(0)
        for engine, calls in now.items():
            gauge = self._gauges.get(engine)
            if gauge is None:
                gauge = self._gauges[engine] = self._gauge_of(engine)
            gauge.set(calls)

    async def run(self, interval_s: float = FLUSH_S) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.flush()

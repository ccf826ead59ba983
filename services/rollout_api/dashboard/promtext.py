"""Prometheus text exposition read back into numbers: sums by label and histogram quantiles.

Names are matched without a leading ``rollout_`` so the dashboard reads a service's metrics
whether or not they carry the platform prefix.
"""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]


class Samples:
    """Every sample of one scrape, by (normalised) sample name."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[tuple[Labels, float]]] = defaultdict(list)

    def add(self, name: str, labels: Labels, value: float) -> None:
        self.by_name[name.removeprefix("rollout_")].append((labels, value))

    def matching(self, name: str, **labels: str) -> list[tuple[Labels, float]]:
        found = self.by_name.get(name.removeprefix("rollout_"), [])
        return [(lab, v) for lab, v in found if all(lab.get(k) == x for k, x in labels.items())]

    def sum(self, name: str, **labels: str) -> float:
        return sum(v for _, v in self.matching(name, **labels) if math.isfinite(v))

    def labelsets(self, name: str) -> list[Labels]:
        return [lab for lab, _ in self.by_name.get(name.removeprefix("rollout_"), [])]

    def buckets(self, histogram: str, **labels: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) of a histogram, summed over the other labels."""
        totals: dict[float, float] = defaultdict(float)
        for lab, value in self.matching(histogram + "_bucket", **labels):
            totals[float(lab["le"])] += value
        return sorted(totals.items())


def parse_metrics(text: str) -> Samples:
    samples = Samples()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.add(sample.name, dict(sample.labels), float(sample.value))
    return samples


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # the highest finite bound, as Prometheus answers
            width = count - lower_count
            share = (rank - lower_count) / width if width else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound

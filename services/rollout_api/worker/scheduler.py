"""Weighted fair share across jobs: stride scheduling.

Each job has a *pass*; the next item comes from the eligible job with the lowest pass, which then
advances by ``1 / weight``. Over time a job with weight 3 is served three times as often as one
with weight 1 while both have work. A job returning from idle starts at the current minimum pass,
so it gets its share from now on rather than a burst for the time it had nothing queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class FairShare:
    def __init__(self) -> None:
        self._weights: dict[str, float] = {}
        self._pass: dict[str, float] = {}
        self._idle: set[str] = set()

    def set_jobs(self, weights: Mapping[str, float]) -> None:
        """The jobs and weights now in force (jobs that disappeared are forgotten)."""
        busy = [p for j, p in self._pass.items() if j not in self._idle]
        floor = min(busy, default=min(self._pass.values(), default=0.0))
        self._weights = {job: max(w, 1e-9) for job, w in weights.items()}
        self._pass = {job: self._pass.get(job, floor) for job in self._weights}
        self._idle = {job for job in self._idle if job in self._weights}

    def order(self, eligible: Iterable[str] | None = None) -> list[str]:
        """Jobs to try, best first."""
        jobs = [j for j in (self._weights if eligible is None else eligible) if j in self._weights]
        return sorted(jobs, key=lambda j: (self._pass[j], j))

    def charge(self, job: str, items: int = 1) -> None:
        """``job`` was served ``items`` items."""
        if job in self._idle:  # back from idle: start from the busy jobs' current pass, not from the past
            self._idle.discard(job)
            busy = [p for j, p in self._pass.items() if j not in self._idle and j != job]
            self._pass[job] = max(self._pass[job], min(busy, default=self._pass[job]))
        self._pass[job] += items / self._weights[job]

    def mark_idle(self, job: str) -> None:
        """``job`` had nothing to take."""
        if job in self._weights:
            self._idle.add(job)

    @property
    def jobs(self) -> list[str]:
        return list(self._weights)

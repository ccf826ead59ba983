"""Which engine takes a call.

With a session (a trajectory id): rendezvous hashing over the routable engines, so every proxy
process picks the same engine and a trajectory keeps its prefix cache; when that engine is far
more loaded than the least-loaded one, the least-loaded one takes the call. Without a session:
the less loaded of two engines drawn at random (power of two choices).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from services.llm_proxy.fleet import EngineRuntime


def affinity_score(session: str, engine_id: str) -> int:
    """Rendezvous (highest random weight) score; stable across processes and restarts."""
    digest = hashlib.blake2b(f"{session}\x00{engine_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class Router:
    overload_factor: float = 2.0
    overload_slack: int = 8

    def choose(self, engines: Sequence[EngineRuntime], session: str | None, rng: random.Random) -> EngineRuntime:
        """Pick from a non-empty sequence."""
        if session:
            return self._sticky(engines, session)
        n = len(engines)
        if n == 1:
            return engines[0]
        i = rng.randrange(n)  # two distinct engines, every pair equally likely (as random.sample)
        j = rng.randrange(n - 1)
        a, b = engines[i], engines[j + (j >= i)]
        return a if a.load <= b.load else b

    def _sticky(self, engines: Sequence[EngineRuntime], session: str) -> EngineRuntime:
        sticky = max(engines, key=lambda e: affinity_score(session, e.engine_id))
        least = min(engines, key=lambda e: e.load)
        if sticky.load > self.overload_factor * least.load + self.overload_slack:
            return least
        return sticky

"""A long-running service's cyclic garbage collector: start-up objects frozen, young collections rare."""

from __future__ import annotations

import gc


def tune_gc(young_threshold: int) -> None:
    """Freeze what start-up allocated and collect young objects far less often.

    A request's objects die by reference counting, not by the cyclic collector, so a collection finds
    next to no garbage; what it does is walk every live object. With Python's default threshold
    (700 net new objects) that meant a young collection every few requests and a full one every few
    seconds, each walking what is in flight and the start-up heap (modules, pydantic models): 26% of
    a proxy worker's CPU with 5,000 calls in flight, and 10% of the broker's at 384 episodes in flight.
    Frozen objects are never walked again; the threshold counts net growth, so collections now follow
    a growing heap, not traffic. Called once the service has started; 0 turns the automatic
    collection off (``gc.collect()`` still works).
    """
    freeze_heap()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


def freeze_heap() -> None:
    """Collect, then move every object the collector tracks to its permanent generation.

    Before a process forks children that do not exec: a child's full collection then neither walks the
    parent's heap nor writes to its objects, each write a copy of a page the child shared with the
    parent. Measured on the fork server's preloaded libraries (about 90,000 tracked objects): a child's
    first full collection copied 7,000 pages and took 72 ms of CPU, against 112 pages and 0.4 ms frozen.
    """
    gc.collect()
    gc.freeze()

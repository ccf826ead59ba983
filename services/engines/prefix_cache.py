"""A tiny prefix cache: how many leading prompt tokens an engine has already seen (``cached_tokens``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from services.engines.replies import prompt_hash

KEY_TOKENS = 16  # prompts that share their first 16 tokens are compared (shorter ones never hit)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix, by binary search over C-speed slice comparisons."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """Remembers up to ``capacity`` token sequences (prompt + answer), least recently used out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, list[int]] = OrderedDict()
        self.hit_tokens = 0
        self.query_tokens = 0

    def lookup(self, prompt_ids: list[int]) -> int:
        key = prompt_hash(prompt_ids[:KEY_TOKENS])
        seen = self._entries.get(key)
        cached = 0 if seen is None else common_prefix_len(seen, prompt_ids)
        if cached == len(prompt_ids):  # SGLang always recomputes at least the last token
            cached = max(0, cached - 1)
        self.hit_tokens += cached
        self.query_tokens += len(prompt_ids)
        return cached

    def insert(self, token_ids: list[int]) -> None:
        if self.capacity <= 0:
            return
        key = prompt_hash(token_ids[:KEY_TOKENS])
        self._entries[key] = token_ids
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def flush(self) -> None:
        self._entries.clear()

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

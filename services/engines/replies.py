"""Where an engine's answers come from: a small Protocol and the seeded simulation behind it."""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Reply:
    """The tokens an engine will emit for one call, before any ``max_new_tokens`` cut."""

    token_ids: list[int]  # content tokens, without the EOS
    ends_with_eos: bool = True  # False: a runaway that only stops at max_new_tokens
    latency_s: float = 0.0  # extra time before the call is scheduled
    logprobs: list[float] | None = None  # the model's own logprobs (torch mode); None: seeded stand-ins


class ReplySource(Protocol):
    """Decides what a call answers. Timing is the scheduler's business, not the source's.

    ``seed`` is the request's ``sampling_seed``: the same seed and prompt give the same answer."""

    def reply(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        ignore_eos: bool,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Reply: ...


def prompt_hash(prompt_ids: Sequence[int]) -> int:
    """A stable 32-bit hash of a prompt (Python's ``hash`` is salted per process)."""
    return zlib.crc32(array("q", prompt_ids).tobytes())


def token_logprob(seed: int, prompt_key: int, position: int) -> float:
    """A deterministic logprob in [-2.0, -0.001) for the token at ``position`` of an answer."""
    mixed = zlib.crc32(f"{seed}:{prompt_key}:{position}".encode())
    return -0.001 - (mixed % 1999) / 1000.0


@dataclass(frozen=True, slots=True)
class SimulatedReplies:
    """Seeded random answers: printable bytes, length uniform in [0.5, 1.5] x ``mean_tokens``."""

    seed: int
    mean_tokens: int
    runaway_fraction: float = 0.0

    def reply(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        ignore_eos: bool,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Reply:
        salt = 0 if seed is None else (seed + 1) * 7_919  # a request's own seed (``sampling_seed``)
        rng = random.Random(self.seed * 1_000_003 + prompt_hash(prompt_ids) + salt)
        runaway = ignore_eos or rng.random() < self.runaway_fraction
        length = max_new_tokens if runaway else rng.randint(max(1, self.mean_tokens // 2), self.mean_tokens * 3 // 2)
        length = min(length, max_new_tokens)
        return Reply(token_ids=rng.choices(_PRINTABLE, k=length), ends_with_eos=not runaway)


_PRINTABLE = [*range(97, 123), 32, 46, 10]  # a-z, space, '.', newline

"""Continuous batching, simulated: a step loop with a prefill cost, a decode cost that grows with
the batch, a KV capacity in tokens and a cap on running requests.

Every step each running request produces one token. A request's KV footprint is its prompt plus
what it has generated; new requests are admitted while they fit, and when decoding would
overflow the capacity the newest request is retracted (back to the front of the queue, keeping
its progress), as SGLang does. The per-step work is O(1) in the number of running requests:
progress is derived from the step counter and completions come off a heap.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger(__name__)

PauseMode = Literal["abort", "retract", "in_place"]


@dataclass(frozen=True, slots=True)
class BatchTiming:
    prefill_s_per_token: float
    decode_step_s: float
    decode_step_per_request_s: float
    kv_capacity_tokens: int
    max_running_requests: int

    def step_seconds(self, prefill_tokens: int, running: int) -> float:
        return prefill_tokens * self.prefill_s_per_token + self.decode_step_s + running * self.decode_step_per_request_s


@dataclass(eq=False)
class Generation:
    """One request inside the engine. ``planned_ids`` is the whole answer (EOS included if any)."""

    rid: str
    prompt_len: int
    planned_ids: list[int]
    ends_with_eos: bool
    stream: bool = False
    cached_tokens: int = 0
    created: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    abort_reason: dict[str, Any] | None = None
    retractions: int = 0
    generated_before: int = 0  # tokens produced before the last (re)admission
    start_step: int = 0
    admitted: int = -1  # admission sequence number; -1 while waiting
    final_len: int | None = None  # set when the generation leaves the engine
    logprobs: list[float] | None = None  # the model's own, when the reply source has them
    input_logprobs: list[float | None] | None = None  # prompt tokens from ``logprob_start_len`` (torch mode)

    @property
    def target_len(self) -> int:
        return len(self.planned_ids)

    @property
    def kv_base(self) -> int:
        return self.prompt_len + self.generated_before


class Scheduler:
    """The engine's batch: a waiting queue, the running set and the step loop."""

    def __init__(self, timing: BatchTiming) -> None:
        self.timing = timing
        self.step = 0
        self.paused = False
        self.waiting: deque[Generation] = deque()
        self.running: dict[str, Generation] = {}
        self.total_retractions = 0
        self.generated_tokens_total = 0
        self._heap: list[tuple[int, int, Generation]] = []
        self._seq = itertools.count()
        self._kv_base = 0  # sum of kv_base over running
        self._start_sum = 0  # sum of start_step over running
        self._wake = asyncio.Event()

    # -- inspection ---------------------------------------------------------------------

    def produced(self, gen: Generation) -> int:
        """Tokens ``gen`` has produced so far."""
        if gen.final_len is not None:
            return gen.final_len
        if gen.admitted < 0:
            return gen.generated_before
        return min(gen.target_len, gen.generated_before + self.step - gen.start_step)

    def used_tokens(self) -> int:
        return self._kv_base + len(self.running) * self.step - self._start_sum

    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    # -- requests -----------------------------------------------------------------------

    def submit(self, gen: Generation) -> None:
        if gen.target_len == 0:
            self._finish(gen, 0)
            return
        self.waiting.append(gen)
        self._wake.set()

    def cancel(self, gen: Generation) -> None:
        """The caller went away: drop the request wherever it is."""
        self._remove(gen, {"type": "abort", "message": "The client disconnected."})

    def abort(self, rid_prefix: str, *, abort_all: bool = False) -> int:
        """Abort requests whose rid starts with ``rid_prefix`` (SGLang matches by prefix)."""
        victims = [g for g in (*self.running.values(), *self.waiting) if abort_all or g.rid.startswith(rid_prefix)]
        for gen in victims:
            self._remove(gen, {"type": "abort", "message": "Abort requested.", "status_code": 200})
        return len(victims)

    def pause(self, mode: PauseMode) -> None:
        self.paused = True
        if mode == "abort":
            self.abort("", abort_all=True)
        elif mode == "retract":
            for gen in sorted(self.running.values(), key=lambda g: -g.admitted):
                self._retract(gen)

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    # -- the step loop ------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if self.paused or not self.busy():
                self._wake.clear()
                await self._wake.wait()
                continue
            prefill = self._admit()
            if not self.running:  # nothing fits and nothing runs: the head can never fit
                head = self.waiting.popleft()
                self._end(head, 0, {"type": "abort", "message": "The request does not fit in the KV cache."})
                continue
            await asyncio.sleep(self.timing.step_seconds(prefill, len(self.running)))
            if self.paused:
                continue
            self._advance()

    def _admit(self) -> int:
        prefill = 0
        while self.waiting and len(self.running) < self.timing.max_running_requests:
            gen = self.waiting[0]
            if self.running and self.used_tokens() + gen.kv_base + 1 > self.timing.kv_capacity_tokens:
                break
            if not self.running and gen.kv_base > self.timing.kv_capacity_tokens:
                break
            self.waiting.popleft()
            prefill += gen.kv_base - (gen.cached_tokens if gen.generated_before == 0 else 0)
            self._start(gen)
        return prefill

    def _start(self, gen: Generation) -> None:
        gen.admitted = next(self._seq)
        gen.start_step = self.step
        self.running[gen.rid] = gen
        self._kv_base += gen.kv_base
        self._start_sum += gen.start_step
        finish_step = self.step + gen.target_len - gen.generated_before
        heapq.heappush(self._heap, (finish_step, gen.admitted, gen))

    def _advance(self) -> None:
        self.step += 1
        self.generated_tokens_total += len(self.running)
        while self.used_tokens() > self.timing.kv_capacity_tokens and len(self.running) > 1:
            newest = max(self.running.values(), key=lambda g: g.admitted)
            self._retract(newest)
        while self._heap and self._heap[0][0] <= self.step:
            _, admitted, gen = heapq.heappop(self._heap)
            if gen.admitted == admitted and gen.rid in self.running:
                self._stop_running(gen)
                self._end(gen, gen.target_len, None)
        for gen in self.running.values():
            if gen.stream:
                gen.progress.set()

    def _retract(self, gen: Generation) -> None:
        produced = self.produced(gen)
        self._stop_running(gen)
        gen.generated_before = produced
        gen.retractions += 1
        self.total_retractions += 1
        if gen not in self.waiting:
            self.waiting.appendleft(gen)

    def _stop_running(self, gen: Generation) -> None:
        del self.running[gen.rid]
        self._kv_base -= gen.kv_base
        self._start_sum -= gen.start_step
        gen.admitted = -1

    def _remove(self, gen: Generation, reason: dict[str, Any]) -> None:
        if gen.final_len is not None:
            return
        produced = self.produced(gen)
        if gen.rid in self.running and self.running[gen.rid] is gen:
            self._stop_running(gen)
        elif gen in self.waiting:
            self.waiting.remove(gen)
        self._end(gen, produced, reason)

    def _finish(self, gen: Generation, length: int) -> None:
        self._end(gen, length, None)

    def _end(self, gen: Generation, length: int, abort_reason: dict[str, Any] | None) -> None:
        gen.final_len = length
        gen.abort_reason = abort_reason
        gen.done.set()
        gen.progress.set()

"""Leases asked for at the same moment go out together: the broker client's lease coalescer.

Episodes that start together (a worker's burst, a GRPO group) each ask for a lease. Each request
joins the batch being gathered; the batch goes out when the moment ends (the same event-loop turn,
or ``window_s`` after its first request) or when it holds ``max_batch`` requests, as ONE
``POST /leases/batch`` with ``warm_only``: the broker makes each lease a warm sandbox is ready for
and answers ``warm_miss`` at once for the others, so no lease of the batch waits for another's
create. Each caller with a lease is answered then; each miss is asked again on its own ``POST
/leases`` (all at once: a cold create, or a wait in the admission queue, as a lone lease would). A
batch of one keeps ``POST /leases``, and a broker without the batch route (404/405: one not upgraded
yet) or without ``warm_only`` (422) gets one ``POST /leases`` per request.

What each caller sees is what its own ``POST /leases`` would have given it: its lease, or the
same ``InfraError`` (stage, code, ``retryable``) for its own refusal; a failure of the whole batch
(the broker unreachable past the outage budget, a timeout, a cut connection) is raised to each of
its callers, and while the broker is unreachable the batch is held and sent again, as every call is.
A caller cancelled while it waits takes its request out of a batch not yet sent; a lease made for it
anyway is released in the background, and no other caller's lease is touched.

Where the client has Redis (``warm_claims.py``), the batch's requests a warm sandbox can serve are
first claimed straight from the pools' offers in Redis, with no broker request; only what is left
goes to the broker as above. A batch then goes out as soon as it holds one claim script's worth
(``CHUNK``) rather than at the end of the window: the first episodes of a burst are claimed while
the next ones still ask.

Requests with a ``setup`` or with network never take a warm sandbox (the broker creates one for them),
so they keep ``POST /leases``: in a batch they could only miss.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from services.protocol.sandboxes import MAX_LEASE_BATCH, Lease, LeaseRequest
from services.protocol.status import ErrorCode
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.warm_claims import CHUNK, Reply

if TYPE_CHECKING:
    from services.rollout_api.worker.broker_client import BrokerClient

log = logging.getLogger(__name__)
Waiter = tuple[LeaseRequest, asyncio.Future[Lease]]
Claiming = tuple[set[int], list[Reply]]  # the batch's indices claimed, the chunks' replies


class LeaseBatcher:
    def __init__(self, client: BrokerClient, window_s: float = 0.0, max_batch: int = MAX_LEASE_BATCH) -> None:
        if not 1 <= max_batch <= MAX_LEASE_BATCH:
            raise ValueError(f"max_batch must be 1..{MAX_LEASE_BATCH}")
        self.client = client
        self.window_s = window_s
        self.max_batch = max_batch
        self.sending: set[asyncio.Task[None]] = set()  # batches in flight (kept referenced)
        self.batches = 0  # ``POST /leases/batch`` requests sent
        self._gathering: list[Waiter] = []
        self._due: asyncio.Handle | None = None  # when the batch being gathered goes out

    async def lease(self, request: LeaseRequest) -> Lease:
        if request.setup is not None or request.network != "none":  # never warm: no batch to wait in
            return await self.client.lease_one(request)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Lease] = loop.create_future()
        self._gathering.append((request, future))
        if len(self._gathering) >= (CHUNK if self.client.claims is not None else self.max_batch):
            self.flush()
        elif self._due is None:
            self._due = loop.call_later(self.window_s, self.flush) if self.window_s > 0 else loop.call_soon(self.flush)
        try:
            return await future
        except asyncio.CancelledError:
            # cancelled after its lease was made (the batch answered in the same turn): not kept
            if future.done() and not future.cancelled() and future.exception() is None:
                self._release(future.result())
            raise

    def flush(self) -> None:
        """Send the batch being gathered now (its callers that were cancelled are left out)."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        batch = [(request, future) for request, future in self._gathering if not future.done()]
        self._gathering = []
        if batch:
            try:
                claiming = self._claim(batch)  # written to Redis now, not once the loop reaches the task below
            except Exception:  # never a batch lost (this runs in a caller's request, or in a timer's callback)
                log.exception("claiming warm sandboxes failed; the broker serves this batch")
                claiming = set(), []
            name = f"lease batch of {len(batch)}"
            task = asyncio.get_running_loop().create_task(self._send(batch, claiming), name=name)
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def _send(self, batch: list[Waiter], claiming: Claiming) -> None:
        try:
            answered, replies = claiming
            for reply in replies:  # each chunk's leases reach their callers as it comes (``_claim``), even
                await asyncio.shield(reply)  # where this task is cancelled meanwhile
            batch = [waiter for i, waiter in enumerate(batch) if i not in answered] if answered else batch
            if not batch:
                return
            requests = [request for request, _ in batch]
            outcomes = await self._outcomes(requests)
            again = []
            for waiter, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, InfraError) and outcome.code is ErrorCode.WARM_MISS:
                    again.append(waiter)
                else:
                    self._settle(waiter, outcome)  # answered now: never after the misses' creates
            if again:  # each miss on its own POST /leases (a create, or a wait in the admission queue)
                await asyncio.gather(*(self._ask_again(waiter) for waiter in again))
        except InfraError as exc:  # the whole request failed: each caller gets it, as its own call would
            for waiter in batch:
                self._settle(waiter, InfraError(exc.stage, exc.code, exc.message, retryable=exc.retryable))
        except BaseException as exc:  # not answered (the client closed): no caller is left waiting
            for _, future in batch:
                if future.done():
                    continue
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            raise

    def _claim(self, batch: list[Waiter]) -> Claiming:
        """Warm sandboxes claimed straight from Redis where the client can (``warm_claims.py``), each
        caller answered as its chunk is claimed (also where the batch's task never runs: a client
        closed meanwhile); the indices answered, filled in as the chunks' replies come, and those
        replies."""
        answered: set[int] = set()
        claims = self.client.claims
        if claims is None:
            return answered, []

        def got(i: int, lease: Lease) -> None:
            answered.add(i)
            self._settle(batch[i], lease)

        return answered, claims.start([request for request, _ in batch], got)

    def _settle(self, waiter: Waiter, outcome: Lease | Exception) -> None:
        future = waiter[1]
        if future.done():  # its caller was cancelled while the batch was out
            if isinstance(outcome, Lease):
                self._release(outcome)
        elif isinstance(outcome, Lease):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    async def _ask_again(self, waiter: Waiter) -> None:
        if not waiter[1].done():  # a caller cancelled meanwhile is not asked for
            self._settle(waiter, await self._one(waiter[0]))

    async def _outcomes(self, requests: list[LeaseRequest]) -> list[Lease | Exception]:
        if len(requests) > 1:
            self.batches += 1
            if self.client.on_batch is not None:
                self.client.on_batch(len(requests))
            outcomes = await self.client.lease_batch(requests, warm_only=True)
            if outcomes is not None:
                return list(outcomes)
        return list(await asyncio.gather(*(self._one(request) for request in requests)))

    async def _one(self, request: LeaseRequest) -> Lease | Exception:
        try:
            return await self.client.lease_one(request)
        except Exception as exc:  # raised to its own caller only, as its own call would raise it
            return exc

    def _release(self, lease: Lease) -> None:
        log.info("lease %s was made for a caller that stopped waiting: released", lease.id)
        self.client.release_later(lease.id)

"""Leases asked for at the same moment go out together: the broker client's lease coalescer.

Episodes that start together (a worker's burst, a GRPO group) each ask for a lease. Each request
joins the batch being gathered; the batch goes out when the moment ends (the same event-loop turn,
or ``window_s`` after its first request) or when it holds ``max_batch`` requests, as ONE
``POST /leases/batch``. The broker makes each lease as ``POST /leases`` would and answers one
lease or one error per request. A batch of one keeps ``POST /leases``, and a broker without the
batch route (404/405: one not upgraded yet) gets one ``POST /leases`` per request.

What each caller sees is what its own ``POST /leases`` would have given it: its lease, or the
same ``InfraError`` (stage, code, ``retryable``) for its own refusal; a failure of the whole batch
(the broker unreachable past the outage budget, a timeout, a cut connection) is raised to each of
its callers, and while the broker is unreachable the batch is held and sent again, as every call is.
A caller cancelled while it waits takes its request out of a batch not yet sent; a lease made for it
anyway is released in the background, and no other caller's lease is touched.

Requests with a ``setup`` never take a warm sandbox (the broker creates one for them), so they keep
``POST /leases``: in a batch they would wait for the slowest create of the batch. A batch answers when
its last lease is made, so a warm lease asked for with leases that miss the pool waits for their
creates too (one batch per moment keeps that to the leases of one burst).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from services.protocol.sandboxes import MAX_LEASE_BATCH, Lease, LeaseRequest
from services.rollout_api.worker.clients import InfraError

if TYPE_CHECKING:
    from services.rollout_api.worker.broker_client import BrokerClient

log = logging.getLogger(__name__)
Waiter = tuple[LeaseRequest, asyncio.Future[Lease]]


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
        if request.setup is not None:
            return await self.client.lease_one(request)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Lease] = loop.create_future()
        self._gathering.append((request, future))
        if len(self._gathering) >= self.max_batch:
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
            task = asyncio.get_running_loop().create_task(self._send(batch), name=f"lease batch of {len(batch)}")
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def _send(self, batch: list[Waiter]) -> None:
        requests = [request for request, _ in batch]
        try:
            outcomes = await self._outcomes(requests)
        except InfraError as exc:  # the whole request failed: each caller gets it, as its own call would
            outcomes = [InfraError(exc.stage, exc.code, exc.message, retryable=exc.retryable) for _ in batch]
        except BaseException as exc:  # not answered (the client closed): no caller is left waiting
            for _, future in batch:
                if future.done():
                    continue
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            raise
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # its caller was cancelled while the batch was out
                if isinstance(outcome, Lease):
                    self._release(outcome)
            elif isinstance(outcome, Lease):
                future.set_result(outcome)
            else:
                future.set_exception(outcome)

    async def _outcomes(self, requests: list[LeaseRequest]) -> list[Lease | Exception]:
        if len(requests) > 1:
            self.batches += 1
            if self.client.on_batch is not None:
                self.client.on_batch(len(requests))
            outcomes = await self.client.lease_batch(requests)
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

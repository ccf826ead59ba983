"""The broker benchmark's load: leases as an agent uses them (lease, a few commands, release),
timed from the client, and the same command run directly on the bare backend."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from services.protocol.sandboxes import ExecRequest, LeaseRequest, Resources
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.warm_claims import WarmClaims
from services.runtime.http_client import Answer, HttpClient
from services.runtime.redis_pool import open_redis
from services.runtime.secrets import FleetSecrets
from services.sandbox_broker.backends import leftovers, make_backend
from services.sandbox_broker.backends.base import LABEL_LEASE, SandboxSpec
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import default_template

TIMEOUT_S = 600.0  # per request: a cold lease on a loaded machine takes tens of seconds


@dataclass
class Outcome:
    start_ms: list[float] = field(default_factory=list)
    exec_ms: list[float] = field(default_factory=list)
    warm: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)  # the first few error responses
    batches: int = 0  # POST /leases/batch requests that carried the leases (the worker's client)
    claimed: int = 0  # leases the worker's client claimed straight from Redis (no broker request)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.samples) < 5:
            self.samples.append(what)


class Load:
    """The broker's client as a worker is (``runtime.http_client``: keep-alive HTTP/1.1, the
    service token), so a figure is what an episode of the rollout API sees."""

    def __init__(self, url: str, commands: int, secrets: FleetSecrets) -> None:
        self.url = url
        self.commands = commands
        self.secrets = secrets
        self.http = HttpClient(url)
        self._auth = {"Authorization": f"Bearer {secrets.service_token}"}
        self._json = {**self._auth, "Content-Type": "application/json"}

    async def reconnect(self) -> None:
        await self.http.close()  # pooled connections died with the old process
        self.http = HttpClient(self.url)

    async def close(self) -> None:
        await self.http.close()

    async def send(self, method: str, path: str, body: Any = None) -> Answer:
        """A request with the service token (JSON ``body`` where there is one)."""
        return await self._send(method, path, body)

    async def _send(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Answer:
        data = b"" if body is None else orjson.dumps(body)
        return await self.http.request(method, path, data, headers or (self._json if body is not None else self._auth),
                                       TIMEOUT_S)  # fmt: skip

    async def register(self, template: dict[str, Any], timeout_s: float) -> None:
        admin = {"Authorization": f"Bearer {self.secrets.admin_token}", "Content-Type": "application/json"}
        answer = await self._send("POST", "/templates", template, admin)
        assert answer.status == 201, answer.body.decode(errors="replace")
        if template["warm_pool"]:
            await self.wait_pool(template["warm_pool"], timeout_s)

    async def create(self, body: dict[str, Any], outcome: Outcome | None = None) -> dict[str, Any] | None:
        answer = await self._send("POST", "/leases", {"wait_s": 300, "ttl_s": 600, **body})
        if answer.status == 201:
            lease: dict[str, Any] = orjson.loads(answer.body)
            return lease
        if outcome is not None:
            outcome.error(f"lease {answer.status}: {answer.body[:300].decode(errors='replace')}")
        return None

    async def exec(self, lease_id: str, shell: str, outcome: Outcome | None = None) -> float | None:
        """Client-side latency in ms, None on an error or a non-zero exit (recorded in ``outcome``)."""
        started = time.monotonic()
        answer = await self._send("POST", f"/leases/{lease_id}/exec", {"shell": shell, "timeout_s": 60})
        body = orjson.loads(answer.body)
        if answer.status == 200 and body["exit_code"] == 0:
            return (time.monotonic() - started) * 1000
        if outcome is not None:
            detail = body if answer.status != 200 else {k: body[k] for k in ("exit_code", "stderr", "timed_out")}
            outcome.error(f"exec {answer.status}: {str(detail)[:300]}")
        return None

    async def release(self, lease_id: str) -> bool:
        return (await self._send("DELETE", f"/leases/{lease_id}")).status == 204

    async def episode(self, body: dict[str, Any], outcome: Outcome) -> None:
        try:
            await self._episode(body, outcome)
        except (ConnectionError, TimeoutError, orjson.JSONDecodeError) as exc:
            outcome.error(f"{type(exc).__name__}: {exc}")

    async def create_batch(self, bodies: list[dict[str, Any]], outcome: Outcome) -> list[dict[str, Any]]:
        """Leases in one ``POST /leases/batch``: those made (the errors recorded in ``outcome``)."""
        answer = await self._send("POST", "/leases/batch", {"leases": [{"wait_s": 300, "ttl_s": 600, **b}
                                                                     for b in bodies]})  # fmt: skip
        if answer.status != 200:
            outcome.error(f"batch {answer.status}: {answer.body[:300].decode(errors='replace')}")
            return []
        made = []
        for result in orjson.loads(answer.body)["results"]:
            if result.get("lease"):
                made.append(result["lease"])
            else:
                outcome.error(f"batch lease: {str(result.get('error'))[:300]}")
        return made

    async def _episode(self, body: dict[str, Any], outcome: Outcome) -> None:
        started = time.monotonic()
        lease = await self.create(body, outcome)
        if lease is None:
            return
        outcome.start_ms.append((time.monotonic() - started) * 1000)
        await self.use(lease, outcome)

    async def use(self, lease: dict[str, Any], outcome: Outcome) -> None:
        """The rest of an episode: its commands, then the release."""
        outcome.warm += int(lease["warm"])
        for i in range(self.commands):
            took = await self.exec(lease["id"], f"echo {i} > f{i} && cat f{i} >/dev/null", outcome)
            if took is not None:
                outcome.exec_ms.append(took)
        if not await self.release(lease["id"]):
            outcome.error("release failed")

    async def overhead(
        self, settings: BrokerSettings, n: int, isolation: str | None = None
    ) -> tuple[list[float], list[float]]:
        """``true`` n times through the broker and n times on the bare backend, interleaved (so that the
        load of a shared machine falls on both alike): (via broker ms, direct ms), pairwise."""
        lease = await self.create({"isolation": isolation} if isolation else {})
        assert lease is not None, "could not lease a sandbox"
        backend = make_backend(settings)
        await backend.start()
        labels = {LABEL_LEASE: lease["id"]}  # accounted for while that lease lives: the broker's reaper spares it
        spec = SandboxSpec(default_template(settings), Resources(), "none", labels, isolation=isolation)
        sandbox = await backend.create(spec)
        via_broker, direct = [], []
        try:
            for _ in range(n):
                took = await self.exec(lease["id"], "true")
                started = time.monotonic()
                result = await backend.exec(sandbox.sandbox_id, ExecRequest(shell="true", timeout_s=60))
                if took is not None and result.exit_code == 0:
                    via_broker.append(took)
                    direct.append((time.monotonic() - started) * 1000)
        finally:
            await backend.destroy(sandbox.sandbox_id)
            await backend.close()
            await self.release(lease["id"])
        return via_broker, direct

    async def wait_pool(self, target: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = await self._send("GET", "/healthz")
            if sum(orjson.loads(answer.body)["pools"].values()) >= target:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the warm pool did not reach {target} within {timeout_s}s")


async def run_leases(load: Load, n: int, body: dict[str, Any]) -> Outcome:
    outcome = Outcome()
    await asyncio.gather(*(load.episode(body, outcome) for _ in range(n)))
    return outcome


async def run_open(load: Load, n: int, body: dict[str, Any]) -> Outcome:
    """:func:`run_leases` over n connections opened first (as the floor's burst is, ``http_floor.py``).
    The client closes connections idle for 4 s, so a burst after a pause would otherwise time n
    TCP connects as well (about 0.5 ms each here), however long the pause before it was."""
    await asyncio.gather(*(load.send("GET", "/healthz") for _ in range(n)))
    return await run_leases(load, n, body)


async def run_worker(load: Load, n: int, body: dict[str, Any], window_s: float, redis_url: str | None) -> Outcome:
    """n episodes asking for their leases at once through the worker's own client
    (``BrokerClient.lease``: with ``redis_url``, warm sandboxes claimed straight from Redis first, as a
    worker does by default; then its coalescer's batches), each timed to the moment it holds its lease.
    The episodes' commands start once every lease is in, as :func:`run_batched`'s do: one client
    process runs all n episodes here, and the execs of the first episodes served would otherwise
    delay the next ones' resumption in its event loop, which is the bench client's queue,
    not the lease's latency (a worker process holds a fraction of a fleet's episodes)."""
    outcome = Outcome()
    settled, all_in = [0], asyncio.Event()
    store = open_redis(redis_url) if redis_url else None
    async with aiohttp.ClientSession() as session:
        client = BrokerClient(session, load.url, TIMEOUT_S, token=load.secrets.service_token, batch_window_s=window_s,
                              claims=WarmClaims(store) if store is not None else None)  # fmt: skip
        request = LeaseRequest.model_validate({"wait_s": 300, "ttl_s": 600, **body})
        if client.claims is not None:  # open before the burst, as a running worker's is (and the HTTP phases')
            await client.claims.connect()

        def one_in() -> None:
            settled[0] += 1
            if settled[0] == n:
                all_in.set()

        async def episode() -> None:
            started = time.monotonic()
            try:
                lease = await client.lease(request)
            except InfraError as exc:
                outcome.error(f"worker lease: {exc}")
                one_in()
                return
            outcome.start_ms.append((time.monotonic() - started) * 1000)
            one_in()
            await all_in.wait()
            try:
                await load.use(lease.model_dump(mode="json"), outcome)
            except (ConnectionError, TimeoutError, orjson.JSONDecodeError) as exc:
                outcome.error(f"{type(exc).__name__}: {exc}")

        try:
            await asyncio.gather(*(episode() for _ in range(n)))
        finally:
            outcome.batches = client.batcher.batches
            outcome.claimed = client.claims.claimed if client.claims is not None else 0
            await client.close()
            if store is not None:
                await store.aclose(close_connection_pool=True)
    return outcome


async def run_batched(load: Load, n: int, body: dict[str, Any]) -> Outcome:
    """n episodes whose leases are asked for in one batch request, each timed to the batch's answer."""
    outcome = Outcome()
    started = time.monotonic()
    try:
        leases = await load.create_batch([body] * n, outcome)
    except (ConnectionError, TimeoutError, orjson.JSONDecodeError) as exc:
        outcome.error(f"{type(exc).__name__}: {exc}")
        return outcome
    outcome.start_ms += [(time.monotonic() - started) * 1000] * len(leases)
    await asyncio.gather(*(load.use(lease, outcome) for lease in leases))
    return outcome


async def run_paced(load: Load, n: int, rate_per_s: float, body: dict[str, Any]) -> Outcome:
    """n episodes started at a steady rate (not all at once): what one lease costs when leases arrive
    the way a fleet's episodes start, rather than as one burst."""
    outcome = Outcome()
    started = time.monotonic()
    episodes = []
    for i in range(n):
        await asyncio.sleep(max(0.0, started + i / rate_per_s - time.monotonic()))
        episodes.append(asyncio.create_task(load.episode(body, outcome)))
    await asyncio.gather(*episodes)
    return outcome


async def leftover_sandboxes(settings: BrokerSettings) -> int:
    """Sandboxes the backend still holds once the broker has stopped (the pool goes with it)."""
    backend = make_backend(settings)
    await backend.start()
    try:
        return len(await backend.list_sandboxes())
    finally:
        await backend.close()


async def leftover_processes(marker: str, grace_s: float = 10.0) -> list[str]:
    """Processes whose command line names ``marker`` (the state directory), by name: slirp4netns or
    bubblewrap of a sandbox that outlived the broker. Those still exiting get ``grace_s`` to go (a
    stopped broker's bubblewraps end with its zygote, late on a loaded host): only what is left then
    counts."""
    deadline = time.monotonic() + grace_s
    while True:
        found = [name for _, name in await asyncio.to_thread(leftovers.processes_naming, marker)]
        if not found or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(0.2)

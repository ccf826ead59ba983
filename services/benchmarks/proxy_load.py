"""The load generator of ``rollout bench proxy``, run in its own process: aiohttp, no caps,
``concurrency`` calls in flight until ``requests`` calls are done.

Prompts are token ids of lengths drawn uniformly from [prompt_min, prompt_max]; a fixed set of
bodies is serialised up front so the generator spends its CPU on HTTP, not on JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import aiohttp
import orjson

DISTINCT_PROMPTS = 64


@dataclass(frozen=True, slots=True)
class LoadSpec:
    targets: tuple[str, ...]  # base URLs; caller j always uses targets[j % len] (one proxy, or every engine)
    concurrency: int
    requests: int
    prompt_min: int = 1024
    prompt_max: int = 64_000
    max_new_tokens: int = 512
    headers: tuple[tuple[str, str], ...] = ()
    seed: int = 0
    call_timeout_s: float = 600.0


@dataclass(slots=True)
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)  # successful calls only
    errors: Counter[str] = field(default_factory=Counter)  # "HTTP 503", "ServerDisconnectedError", ...
    wall_s: float = 0.0

    def merge(self, other: LoadResult) -> None:
        """Pool another run's calls into this one (throughput = all calls over all wall time)."""
        self.latencies_s += other.latencies_s
        self.errors += other.errors
        self.wall_s += other.wall_s

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else 0.0


def build_bodies(spec: LoadSpec) -> list[bytes]:
    rng = random.Random(spec.seed)
    bodies = []
    for i in range(DISTINCT_PROMPTS):
        length = rng.randint(spec.prompt_min, spec.prompt_max)
        prompt = [rng.randrange(256) for _ in range(length)]
        sampling = {"max_new_tokens": spec.max_new_tokens, "temperature": 1.0}
        bodies.append(orjson.dumps({"input_ids": prompt, "sampling_params": sampling, "bench_prompt": i}))
    return bodies


async def run_load(spec: LoadSpec) -> LoadResult:
    bodies = build_bodies(spec)
    result = LoadResult()
    counter = itertools.count()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=4)
    headers = {"Content-Type": "application/json", **dict(spec.headers)}
    timeout = aiohttp.ClientTimeout(total=spec.call_timeout_s, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def caller(j: int) -> None:
            url = spec.targets[j % len(spec.targets)] + "/generate"
            while (i := next(counter)) < spec.requests:
                started = time.perf_counter()
                try:
                    async with session.post(url, data=bodies[i % len(bodies)], headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            result.errors[f"HTTP {resp.status}"] += 1
                            continue
                except (aiohttp.ClientError, TimeoutError) as exc:
                    result.errors[type(exc).__name__] += 1
                    continue
                result.latencies_s.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(caller(j) for j in range(spec.concurrency)))
        result.wall_s = time.perf_counter() - started
    return result


def _child(spec: LoadSpec, conn: Connection) -> None:
    import uvloop

    conn.send(uvloop.run(run_load(spec)))
    conn.close()


def run_in_process(spec: LoadSpec) -> LoadResult:
    """Run the load in a fresh process (so its CPU is not the orchestrator's) and return the result."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, child), daemon=True)
    proc.start()
    child.close()
    try:
        result: LoadResult = parent.recv()
    except EOFError as exc:
        raise RuntimeError(f"load generator exited with {proc.exitcode}") from exc
    finally:
        proc.join(timeout=30)
    return result

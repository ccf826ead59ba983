"""``rollout bench gateway``: what the agent gateway adds to an LLM call, on simulated engines.

Prefix-extending agents (OpenAI chat completions: system + task, then per turn the reply and an
observation) run through the gateway, ``--turns`` calls each; then every call the gateway recorded
is replayed (its exact prompt ids and ``max_new_tokens``) against the same engines' ``/generate``
directly, at the same concurrency. Two phases, each with its own sessions:

- **latency** (``--concurrency``, default 8 sessions at once): a load at which one proxy process is
  not CPU-saturated, so the difference is what one call costs, not queueing for the process's CPU.
  ``gateway_added_latency_p50_ms`` / ``_p99_ms``: the gateway's latency percentile minus the direct
  one; ``gateway_proxy_cpu_util``: the proxy's CPU over the phase's wall time per proxy process
  (1.0 = one core busy all the time: saturated), printed so a reader sees it was not;
  ``gateway_cpu_ms_per_call``: the proxy's CPU over the phase per call (it includes forwarding
  the ``/generate`` call); ``gateway_calls_per_s``; ``gateway_internal_p50_ms``: the gateway's own
  time per call as it records it (``total_s - llm_s``); ``gateway_engine_call_p50_ms``: the engine
  call as the gateway times it (through the proxy's forwarder).
- **saturation** (``--saturation-concurrency``, default 32 per proxy process; 0 skips it): capacity.
  ``saturated_calls_per_s`` (gateway calls per second), ``saturated_added_latency_p50_ms`` /
  ``_p99_ms`` (mostly queueing for the proxy's CPU at this load), ``saturated_proxy_cpu_util``,
  ``saturated_cpu_ms_per_call``, ``saturated_concurrency``.

Over both phases: ``merge_rate`` (share of later calls merged into their session's token
sequence: 1.0 for these agents) and ``errors`` (failed gateway or direct calls).
``host_load_1m_before`` / ``_after``: the machine's load average, since other work on the
machine (the bench itself runs the client, the engines, Redis and the proxy on it) moves every
latency figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis

from services.benchmarks.proxy_fleet import start_engines, start_proxy, stopping
from services.benchmarks.report import percentile, write_json
from services.protocol import keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, new_session_token, token_digest
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tables import print_table
from services.runtime.tokenizer import write_tokenizer_dir

MAX_NEW = 32
SATURATION_PER_PROCESS = 32


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gateway", help="agent gateway vs /generate direct on the same simulated engines")
    p.add_argument("--sessions", type=int, default=500, help="agent sessions per phase (default 500)")
    p.add_argument("--turns", type=int, default=4, help="calls per session (default 4)")
    p.add_argument("--concurrency", type=int, default=8, help="sessions at once in the latency phase (default 8)")
    p.add_argument("--saturation-concurrency", type=int, default=None,
                   help=f"sessions at once in the saturation phase (default {SATURATION_PER_PROCESS} per proxy "
                        "process; 0: no saturation phase)")  # fmt: skip
    p.add_argument("--engines", type=int, default=2, help="simulated engines (default 2)")
    p.add_argument("--workers", type=int, default=1, help="proxy processes (default 1)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    engine_args = ["--decode-step-s", "0.002", "--output-tokens", "16", "--decode-step-per-request-s", "0.00002"]
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp, EmbeddedRedis() as server:
        model = write_tokenizer_dir(Path(tmp) / "tokenizer")
        engines, urls = start_engines(args.engines, 1, engine_args, Path(tmp))
        with stopping(engines) as launched:
            os.environ["ROLLOUT_REDIS_URL"] = server.url  # the sessions live where the bench writes them
            proxy = start_proxy(urls, args.workers, Path(tmp), "--gateway-tokenizers", f"default={model}")
            launched.append(proxy)
            figures = asyncio.run(measure(args, proxy.url, server.url, proxy.cpu_s))
    title = (
        f"gateway benchmark: {args.sessions} sessions x {args.turns} calls per phase, {args.workers} proxy process(es)"
    )
    print_table(title, figures["rows"])
    print(f"\nlatency phase: {args.concurrency} sessions at once, proxy CPU {figures['gateway_proxy_cpu_util']:.2f} "
          "of a core per process (1.0: saturated)")  # fmt: skip
    if "saturated_concurrency" in figures:
        print(f"saturation phase: {figures['saturated_concurrency']} sessions at once, proxy CPU "
              f"{figures['saturated_proxy_cpu_util']:.2f} of a core per process")  # fmt: skip
    write_json(args.json, figures)
    return 0


@dataclass(frozen=True, slots=True)
class Phase:
    gateway_ms: list[float]
    direct_ms: list[float]
    calls: list[GatewayCall]
    errors: int
    wall_s: float
    cpu_s: float

    def added(self, q: float) -> float:
        return percentile(self.gateway_ms, q) - percentile(self.direct_ms, q)

    def util(self, workers: int) -> float:
        """The proxy's CPU per process over the phase's wall time (1.0: one core busy throughout)."""
        return self.cpu_s / self.wall_s / workers

    def cpu_ms_per_call(self) -> float:
        return self.cpu_s * 1000 / max(1, len(self.gateway_ms))


async def measure(args: argparse.Namespace, proxy: str, redis_url: str, cpu: Any) -> dict[str, Any]:
    store = redis.Redis.from_url(redis_url)
    saturation = args.saturation_concurrency
    if saturation is None:
        saturation = SATURATION_PER_PROCESS * args.workers
    load_before = os.getloadavg()[0]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await _agent(http, proxy, _session(store), 1)  # warm up (template load, connections)
        latency = await _phase(http, proxy, store, args, args.concurrency, cpu)
        saturated = await _phase(http, proxy, store, args, saturation, cpu) if saturation > 0 else None
    store.close()
    calls = latency.calls + (saturated.calls if saturated else [])
    later = [c for c in calls if c.index > 0]
    figures: dict[str, Any] = {
        "gateway_added_latency_p50_ms": latency.added(50), "gateway_added_latency_p99_ms": latency.added(99),
        "gateway_p50_ms": percentile(latency.gateway_ms, 50), "direct_p50_ms": percentile(latency.direct_ms, 50),
        "gateway_p99_ms": percentile(latency.gateway_ms, 99), "direct_p99_ms": percentile(latency.direct_ms, 99),
        "merge_rate": sum(c.merged for c in later) / max(1, len(later)),
        "errors": latency.errors + (saturated.errors if saturated else 0),
        "gateway_cpu_ms_per_call": latency.cpu_ms_per_call(), "gateway_proxy_cpu_util": latency.util(args.workers),
        "calls": len(latency.gateway_ms), "gateway_calls_per_s": len(latency.gateway_ms) / latency.wall_s,
        "sessions": args.sessions, "turns": args.turns, "concurrency": args.concurrency, "workers": args.workers,
        "gateway_internal_p50_ms": percentile([(c.total_s - c.llm_s) * 1000 for c in latency.calls], 50),
        "gateway_engine_call_p50_ms": percentile([c.llm_s * 1000 for c in latency.calls], 50),
        "host_load_1m_before": load_before, "host_load_1m_after": os.getloadavg()[0],
    }  # fmt: skip
    if saturated is not None:
        figures |= {
            "saturated_concurrency": saturation, "saturated_calls_per_s": len(saturated.gateway_ms) / saturated.wall_s,
            "saturated_added_latency_p50_ms": saturated.added(50),
            "saturated_added_latency_p99_ms": saturated.added(99),
            "saturated_gateway_p50_ms": percentile(saturated.gateway_ms, 50),
            "saturated_direct_p50_ms": percentile(saturated.direct_ms, 50),
            "saturated_proxy_cpu_util": saturated.util(args.workers),
            "saturated_cpu_ms_per_call": saturated.cpu_ms_per_call(),
        }  # fmt: skip
    figures["rows"] = [{"figure": k, "value": round(v, 3) if isinstance(v, float) else v} for k, v in figures.items()]
    return figures


async def _phase(
    http: aiohttp.ClientSession, proxy: str, store: redis.Redis, args: argparse.Namespace, concurrency: int, cpu: Any
) -> Phase:
    """``args.sessions`` new sessions through the gateway, ``concurrency`` at once, then their calls direct."""
    sessions = [_session(store) for _ in range(args.sessions)]
    cpu_before, started = cpu(), time.perf_counter()
    gateway = await _bounded(concurrency, [_agent(http, proxy, s, args.turns) for s in sessions])
    wall_s, cpu_s = time.perf_counter() - started, cpu() - cpu_before
    calls = [c for sid, _ in sessions for c in _calls(store, sid)]
    direct = await _bounded(concurrency, [_direct(http, f"http://{c.engine_id}", c) for c in calls])
    ok_gateway = [ms for batch in gateway for ms in batch if ms is not None]
    ok_direct = [ms for batch in direct for ms in batch if ms is not None]
    errors = sum(ms is None for batch in gateway for ms in batch) + sum(ms is None for b in direct for ms in b)
    return Phase(ok_gateway, ok_direct, calls, errors, wall_s, cpu_s)


def _session(store: redis.Redis) -> tuple[str, str]:
    sid, token = secrets.token_hex(8), new_session_token()
    record = GatewaySession(session=sid, token_sha256=token_digest(token), job="bench", trajectory_id=sid, attempt=1,
                            pool="default", expires_at=time.time() + 3600, max_turns=1000, max_tokens_per_turn=MAX_NEW,
                            max_trajectory_tokens=60_000)  # fmt: skip
    store.set(keys.gateway_session(sid), record.model_dump_json(), ex=3600)
    return sid, token


async def _agent(http: aiohttp.ClientSession, proxy: str, session: tuple[str, str], turns: int) -> list[float | None]:
    sid, token = session
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a shell agent."},
                                      {"role": "user", "content": f"Task {sid}: find the bug."}]  # fmt: skip
    out: list[float | None] = []
    for turn in range(turns):
        started = time.perf_counter()
        async with http.post(f"{proxy}/e/{sid}/v1/chat/completions", json={"model": "policy", "messages": messages},
                             headers={"Authorization": f"Bearer {token}"}) as response:  # fmt: skip
            doc = await response.json(content_type=None)
        if response.status != 200:
            out.append(None)
            break
        out.append((time.perf_counter() - started) * 1000)
        messages += [{"role": "assistant", "content": doc["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"observation {turn}: exit code 0"}]  # fmt: skip
    return out


def _calls(store: redis.Redis, sid: str) -> list[GatewayCall]:
    raw: list[bytes] = store.lrange(keys.gateway_calls(sid), 0, -1)  # type: ignore[assignment]
    return [decode_call(item) for item in raw]


async def _direct(http: aiohttp.ClientSession, engine: str, call: GatewayCall) -> list[float | None]:
    body = {"input_ids": list(call.prompt_ids), "return_logprob": True,
            "sampling_params": {"max_new_tokens": MAX_NEW, "skip_special_tokens": False}}  # fmt: skip
    started = time.perf_counter()
    async with http.post(f"{engine}/generate", json=body) as response:
        await response.read()
    return [(time.perf_counter() - started) * 1000 if response.status == 200 else None]


async def _bounded(limit: int, jobs: list[Any]) -> list[list[float | None]]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> list[float | None]:
        async with gate:
            result: list[float | None] = await job
            return result

    return list(await asyncio.gather(*(one(j) for j in jobs)))

"""``rollout bench gateway``: what the agent gateway adds to an LLM call, on simulated engines.

Phase 1 runs ``--sessions`` prefix-extending agents through the gateway (OpenAI chat completions:
system + task, then per turn the reply and an observation), ``--concurrency`` sessions at once.
Phase 2 replays every call the gateway recorded (its exact prompt ids and ``max_new_tokens``)
against the same engines' ``/generate`` directly, at the same concurrency. Figures:
``gateway_added_latency_p50_ms`` / ``_p99_ms`` (gateway minus direct, per percentile),
``merge_rate`` (share of later calls merged into their session's token sequence: 1.0 for these
agents), ``errors``, ``gateway_cpu_ms_per_call`` (the proxy's CPU over phase 1 per call; it
includes forwarding the ``/generate`` call).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import redis

from services.benchmarks.proxy_fleet import start_engines, start_proxy, stopping
from services.benchmarks.report import percentile, write_json
from services.protocol import keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, token_digest
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tables import print_table
from services.runtime.tokenizer import write_tokenizer_dir

MAX_NEW = 32


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gateway", help="agent gateway vs /generate direct on the same simulated engines")
    p.add_argument("--sessions", type=int, default=500, help="agent sessions (default 500)")
    p.add_argument("--turns", type=int, default=4, help="calls per session (default 4)")
    p.add_argument("--concurrency", type=int, default=32, help="sessions at once (default 32)")
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
    print_table(f"gateway benchmark: {args.sessions} sessions x {args.turns} calls", figures["rows"])
    write_json(args.json, figures)
    return 0


async def measure(args: argparse.Namespace, proxy: str, redis_url: str, cpu: Any) -> dict[str, Any]:
    store = redis.Redis.from_url(redis_url)
    sessions = [_session(store) for _ in range(args.sessions)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await _agent(http, proxy, sessions[0], 1)  # warm up (template load, connections)
        cpu_before = cpu()
        started = time.perf_counter()
        gateway = await _bounded(args.concurrency, [_agent(http, proxy, s, args.turns) for s in sessions[1:]])
        gateway_s, cpu_ms = time.perf_counter() - started, (cpu() - cpu_before) * 1000
        calls = [c for sid, _ in sessions[1:] for c in _calls(store, sid)]
        direct = await _bounded(args.concurrency, [_direct(http, f"http://{c.engine_id}", c) for c in calls])
    store.close()
    ok_gateway = [ms for batch in gateway for ms in batch if ms is not None]
    ok_direct = [ms for batch in direct for ms in batch if ms is not None]
    errors = sum(ms is None for batch in gateway for ms in batch) + sum(ms is None for b in direct for ms in b)
    later = [c for c in calls if c.index > 0]
    figures: dict[str, Any] = {
        "gateway_added_latency_p50_ms": percentile(ok_gateway, 50) - percentile(ok_direct, 50),
        "gateway_added_latency_p99_ms": percentile(ok_gateway, 99) - percentile(ok_direct, 99),
        "gateway_p50_ms": percentile(ok_gateway, 50), "direct_p50_ms": percentile(ok_direct, 50),
        "gateway_p99_ms": percentile(ok_gateway, 99), "direct_p99_ms": percentile(ok_direct, 99),
        "merge_rate": sum(c.merged for c in later) / max(1, len(later)), "errors": errors,
        "gateway_cpu_ms_per_call": cpu_ms / max(1, len(ok_gateway)), "calls": len(ok_gateway),
        "gateway_calls_per_s": len(ok_gateway) / gateway_s, "sessions": args.sessions - 1, "turns": args.turns,
        "concurrency": args.concurrency,
        "gateway_internal_p50_ms": percentile([(c.total_s - c.llm_s) * 1000 for c in calls], 50),
        "gateway_engine_call_p50_ms": percentile([c.llm_s * 1000 for c in calls], 50),
    }  # fmt: skip
    figures["rows"] = [{"figure": k, "value": round(v, 3) if isinstance(v, float) else v} for k, v in figures.items()]
    return figures


def _session(store: redis.Redis) -> tuple[str, str]:
    sid, token = secrets.token_hex(8), secrets.token_urlsafe(16)
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

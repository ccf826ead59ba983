"""``rollout bench proxy --replay FILE --proxy-url URL``: a dump's LLM traffic against any proxy.

Each trajectory of the dump (``rollout trajectories export``) becomes a session of ``/generate``
calls with its real prompts: turn k sends the first prompt plus every token before turn k's
generated tokens (so prompts grow as in the episode), asks for exactly the tokens that turn
generated (``ignore_eos``), and carries the trajectory as ``X-Session-Id``. Sessions start at
their recorded offsets and wait the recorded gaps (sandbox start + setup before the first call,
the command's time after each), all divided by ``--time-scale``. Reported: per-call latency,
errors, how late calls started against the schedule, and affinity: the share of a session's
calls after its first that the same engine served as the call before (prefix-cache reuse).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from services.benchmarks.report import percentile
from services.protocol import Trajectory
from services.protocol.llm import HEADER_ENGINE, HEADER_POOL, HEADER_SESSION


@dataclass(frozen=True, slots=True)
class Call:
    wait_s: float  # after the session's previous call returned (its first: after the session started)
    prompt_tokens: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Session:
    name: str
    start_s: float  # after the replay started
    calls: tuple[Call, ...]


@dataclass(slots=True)
class Outcome:
    latencies_s: list[float] = field(default_factory=list)
    lateness_s: list[float] = field(default_factory=list)  # call start minus its scheduled time
    errors: Counter[str] = field(default_factory=Counter)
    engines: Counter[str] = field(default_factory=Counter)
    same_engine: int = 0
    followups: int = 0  # calls after a session's first successful call
    prompts: dict[str, list[int]] = field(default_factory=dict)  # session -> prompt lengths sent, in order


def session_of(traj: Trajectory, t0: float, scale: float, tag: str) -> Session:
    calls, wait = [], (traj.timings.sandbox_start_s + traj.timings.setup_s) / scale
    prompt, response = list(traj.prompt_ids), traj.response_ids
    for turn in traj.turns:
        ids = prompt + list(response[: turn.response_offset])
        sampling = {"max_new_tokens": max(1, turn.response_tokens), "ignore_eos": True, "temperature": 1.0}
        calls.append(Call(wait, len(ids), orjson.dumps({"input_ids": ids, "sampling_params": sampling})))
        wait = turn.exec_s / scale
    return Session(f"{traj.attempt_key}{tag}", max(0.0, traj.started_at - t0) / scale, tuple(calls))


def sessions_from(trajectories: list[Trajectory], scale: float, tag: str = "") -> list[Session]:
    """Sessions of every trajectory with at least one turn, offsets relative to the earliest start."""
    with_turns = [t for t in trajectories if t.turns]
    t0 = min((t.started_at for t in with_turns), default=0.0)
    return sorted((session_of(t, t0, scale, tag) for t in with_turns), key=lambda s: s.start_s)


async def _call(http: aiohttp.ClientSession, url: str, call: Call, headers: dict[str, str], out: Outcome) -> str | None:
    started = time.perf_counter()
    try:
        async with http.post(url, data=call.body, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                out.errors[f"HTTP {resp.status}"] += 1
                return None
            engine = resp.headers.get(HEADER_ENGINE, "?")
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.errors[type(exc).__name__] += 1
        return None
    out.latencies_s.append(time.perf_counter() - started)
    out.engines[engine] += 1
    return engine


async def _run_session(http: aiohttp.ClientSession, url: str, s: Session, pool: str | None, began: float,
                       out: Outcome) -> None:  # fmt: skip
    headers = {"Content-Type": "application/json", HEADER_SESSION: s.name, **({HEADER_POOL: pool} if pool else {})}
    due = began + s.start_s
    previous: str | None = None
    out.prompts[s.name] = []
    for call in s.calls:
        due += call.wait_s
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        out.lateness_s.append(max(0.0, time.perf_counter() - due))
        out.prompts[s.name].append(call.prompt_tokens)
        engine = await _call(http, url, call, headers, out)
        if engine is not None and previous is not None:
            out.followups += 1
            out.same_engine += engine == previous
        previous = engine or previous
        due = time.perf_counter()


async def replay(sessions: list[Session], proxy_url: str, pool: str | None, timeout_s: float) -> tuple[Outcome, float]:
    out = Outcome()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=4)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        began = time.perf_counter()
        url = proxy_url.rstrip("/") + "/generate"
        await asyncio.gather(*(_run_session(http, url, s, pool, began, out) for s in sessions))
    return out, time.perf_counter() - began


def figures(sessions: list[Session], out: Outcome, wall_s: float, scale: float) -> dict[str, Any]:
    lat, late = out.latencies_s, out.lateness_s
    growing = sum(all(b > a for a, b in itertools.pairwise(p)) for p in out.prompts.values())
    return {
        "sessions": len(sessions), "calls": len(lat) + sum(out.errors.values()), "ok": len(lat),
        "errors": sum(out.errors.values()), "error_kinds": dict(out.errors), "time_scale": scale, "wall_s": wall_s,
        "latency_p50_s": percentile(lat, 50), "latency_p90_s": percentile(lat, 90),
        "latency_p99_s": percentile(lat, 99), "latency_max_s": max(lat, default=float("nan")),
        "start_lateness_p50_s": percentile(late, 50), "start_lateness_p99_s": percentile(late, 99),
        "affinity": out.same_engine / out.followups if out.followups else None,
        "sessions_with_growing_prompts": growing, "calls_per_engine": dict(out.engines),
        "prompt_tokens_sent": sum(sum(p) for p in out.prompts.values()),
    }  # fmt: skip


def replay_dump(path: Path, proxy_url: str, *, scale: float, pool: str | None, timeout_s: float = 600.0,
               limit: int | None = None) -> dict[str, Any]:  # fmt: skip
    from services.rollout_api.dump import read_dump

    trajectories = []
    for traj in read_dump(path):
        trajectories.append(traj)
        if limit is not None and len(trajectories) >= limit:
            break
    sessions = sessions_from(trajectories, scale, tag=f"@{time.time_ns():x}")
    out, wall_s = asyncio.run(replay(sessions, proxy_url, pool, timeout_s))
    return figures(sessions, out, wall_s, scale)

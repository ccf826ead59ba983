"""``rollout bench agents``: each installed harness, unmodified, on a small task set through its own
gateway sessions, against a scripted engine that answers in the pool's tool-call format (Hermes):
a call of the harness's shell tool, then the answer.

The engine sits behind a recording relay (:mod:`services.benchmarks.engine_tap`), so a call is
``token_exact`` when the ids the gateway recorded (prompt and output) are exactly what the engine
was given and generated. Per harness: ``episodes``, ``finished`` (episodes that exited 0 with the
scripted answer), ``token_exact`` (share of calls), ``merge_rate`` (share of later calls merged
into their session's token sequence), ``segments_per_episode``, ``calls``, ``mismatches`` (calls
whose re-rendered history differed from the recorded ids), ``gateway_added_latency_p50_ms`` (the
gateway's own time per call, ``total_s - llm_s``), ``errors`` (episodes that failed, timed out or
called nothing) and ``skipped`` (why a harness could not run here). Top level: ``harnesses_total``
(harnesses run), ``harnesses_token_exact`` (those with every call token-exact, every episode
finished and no errors) and per dialect the added latency p50.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import redis

from services.benchmarks.agents_inside import Broker, local_broker, run_inside
from services.benchmarks.bundled_harnesses import Inside, ensure_bundles, inside
from services.benchmarks.engine_tap import EngineTap
from services.benchmarks.harnesses import HARNESSES, Episode, Harness, Launch, openai_sdk_example
from services.benchmarks.npm_harness import HarnessUnavailable
from services.benchmarks.proxy_fleet import launch, start_proxy, stopping
from services.benchmarks.report import percentile, write_json
from services.protocol import keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, new_session_token, token_digest
from services.runtime.net import free_port
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tables import print_table
from services.runtime.tokenizer import write_tokenizer_dir

BUNDLES = Path("/var/cache/rollout-agents")
Row = dict[str, Any]
TASKS = (  # (task, shell command, answer); the workdir holds a.txt ("a") and b.txt ("b")
    ("List the files here.", "ls", "There are two files."),
    ("Show what a.txt holds.", "cat a.txt", "a.txt holds one line: a."),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agents", help="real harnesses through the gateway: token-exact, merged, added latency")
    p.add_argument("--harness", action="append", choices=sorted(HARNESSES), default=None,
                   help="run only this harness (repeatable; default: all installed)")  # fmt: skip
    p.add_argument("--tasks", type=int, default=len(TASKS), help=f"tasks per harness (1..{len(TASKS)})")
    p.add_argument("--timeout-s", type=float, default=120, help="per episode (default 120)")
    p.add_argument("--where", choices=["sandbox", "host"], default="sandbox",
                   help="sandbox (default): each episode in a local task sandbox, the harness from its agent "
                        "bundle; host: the harness on this host in a temp directory")  # fmt: skip
    p.add_argument("--bundles", type=Path, default=BUNDLES,
                   help=f"agent bundles (built there when missing; default {BUNDLES})")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.set_defaults(handler=run)


def task_tag(task: str, harness: str) -> str:
    return f"{task} (case {harness})"


@dataclass
class Stack:
    proxy_url: str
    redis: redis.Redis
    tap: EngineTap
    redis_url: str = ""

    def session(self) -> tuple[str, str]:
        sid, token = secrets.token_hex(8), new_session_token()
        record = GatewaySession(
            session=sid, token_sha256=token_digest(token), job="bench-agents", trajectory_id=f"t-{sid}", attempt=1,
            pool="default", expires_at=time.time() + 3600, max_turns=20, max_tokens_per_turn=400,
            max_trajectory_tokens=500_000,
        )  # fmt: skip
        self.redis.set(keys.gateway_session(sid), record.model_dump_json())
        return sid, token

    def calls(self, sid: str) -> list[GatewayCall]:
        raw: list[bytes] = self.redis.lrange(keys.gateway_calls(sid), 0, -1)  # type: ignore[assignment]
        return [decode_call(item) for item in raw]


@contextmanager
def stack(tmp: Path, harnesses: list[Harness], tasks: int) -> Iterator[Stack]:
    model = write_tokenizer_dir(tmp / "tokenizer")
    rules = [{"match": m, "replies": r} for h in harnesses for t, c, a in TASKS[:tasks]
             for m, r in h.rules(task_tag(t, h.name), c, a)]  # fmt: skip
    (tmp / "script.json").write_text(json.dumps({"rules": rules, "default": "I am done."}))
    port = free_port()
    argv = [sys.executable, "-m", "services.cli", "engine", "--mode", "scripted", "--script", str(tmp / "script.json"),
            "--model-path", str(model), "--port", str(port)]  # fmt: skip
    with EmbeddedRedis() as server, stopping([]) as launched:
        launched.append(launch("engine", argv, f"http://127.0.0.1:{port}", "/health", tmp / "logs"))
        with EngineTap(launched[0].url) as tap:
            before = os.environ.get("ROLLOUT_REDIS_URL")
            os.environ["ROLLOUT_REDIS_URL"] = server.url  # the sessions live where the bench writes them
            try:
                proxy = start_proxy([tap.url], 1, tmp / "logs", "--gateway-tokenizers", f"default={model}")
            finally:
                if before is None:
                    del os.environ["ROLLOUT_REDIS_URL"]
                else:
                    os.environ["ROLLOUT_REDIS_URL"] = before
            launched.append(proxy)
            client = redis.Redis.from_url(server.url)
            try:
                yield Stack(proxy.url, client, tap, server.url)
            finally:
                client.close()


def run_episode(
    st: Stack, harness: Harness, exe: str, task: tuple[str, str, str], tmp: Path, timeout_s: float
) -> dict[str, Any]:
    text, _, answer = task
    sid, token = st.session()
    home = Path(tempfile.mkdtemp(prefix=f"{harness.name}-", dir=tmp))
    work = home / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / "b.txt").write_text("b\n")
    spec: Launch = harness.launch(exe, Episode(st.proxy_url, sid, token, home, work, task_tag(text, harness.name)))
    error, stdout = "", ""
    try:
        done = subprocess.run(spec.argv, env={**os.environ, **spec.env}, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
        stdout = done.stdout
        if done.returncode != 0:
            error = f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
        elif harness.answer_on_stdout and not done.stdout.strip().endswith(answer):
            error = f"unexpected answer: {done.stdout.strip()[-200:]}"
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout_s:g} s"
    calls = st.calls(sid)
    if not error and len(calls) < harness.calls:
        error = f"{len(calls)} gateway calls, {harness.calls} scripted: {stdout.strip()[-300:]}"
    if not error and harness.edit and answer not in _read(work / "ANSWER.txt"):
        error = f"ANSWER.txt holds {_read(work / 'ANSWER.txt')[-200:]!r}"
    exact = [st.tap.generated(list(c.prompt_ids), list(c.output_ids)) for c in calls]
    return {"sid": sid, "calls": calls, "error": error, "exact": exact}


def run_episode_inside(st: Stack, broker: Broker, harness: Harness, how: Inside, task: tuple[str, str, str],
                       timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """One episode inside a fresh task sandbox, the harness from its bundle."""
    text, _, answer = task
    sid, token = st.session()
    try:
        error = run_inside(broker, st.proxy_url, harness, how, (sid, token), task_tag(text, harness.name), answer,
                           timeout_s)  # fmt: skip
    except (httpx.HTTPError, RuntimeError) as exc:
        error = f"broker: {exc}"
    calls = st.calls(sid)
    if not error and len(calls) < harness.calls:
        error = f"{len(calls)} gateway calls, {harness.calls} scripted"
    exact = [st.tap.generated(list(c.prompt_ids), list(c.output_ids)) for c in calls]
    return {"sid": sid, "calls": calls, "error": error, "exact": exact}


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def measure_harness(harness: Harness, episode: Callable[[tuple[str, str, str]], dict[str, Any]],
                    tasks: int) -> dict[str, Any]:  # fmt: skip
    episodes = [episode(t) for t in TASKS[:tasks]]
    calls = [c for e in episodes for c in e["calls"]]
    later = [c for c in calls if c.index > 0]
    exact = [x for e in episodes for x in e["exact"]]
    errors = [e["error"] for e in episodes if e["error"]]
    added = [max(0.0, c.total_s - c.llm_s) * 1000 for c in calls]
    return {
        "harness": harness.name,
        "route": harness.route,
        "episodes": len(episodes),
        "finished": len(episodes) - len(errors),
        "token_exact": round(sum(exact) / len(exact), 4) if exact else 0.0,
        "merge_rate": round(sum(c.merged for c in later) / len(later), 4) if later else None,
        "segments_per_episode": round(sum(len({c.segment for c in e["calls"]}) for e in episodes) / len(episodes), 3),
        "calls": len(calls),
        "mismatches": sum(c.mismatch for c in calls),
        "gateway_added_latency_p50_ms": round(percentile(added, 50), 3) if added else None,
        "errors": len(errors),
        "error_detail": errors,
    }


def run(args: argparse.Namespace) -> int:
    names = args.harness or list(HARNESSES)
    tasks = max(1, min(args.tasks, len(TASKS)))
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        if args.where == "sandbox":
            rows, skipped = _inside(args, names, tasks, Path(tmp))
        else:
            rows, skipped = _on_host(args, names, tasks, Path(tmp))
    exact = [r for r in rows if r["token_exact"] == 1.0 and r["errors"] == 0 and r["finished"] == r["episodes"]]
    by_route: dict[str, list[float]] = {}
    for r in rows:
        if r["gateway_added_latency_p50_ms"] is not None:
            by_route.setdefault(r["route"], []).append(r["gateway_added_latency_p50_ms"])
    figures = {
        "where": args.where,
        "harnesses_total": len(rows),
        "harnesses_token_exact": len(exact),
        "tasks_per_harness": tasks,
        "added_latency_p50_ms_by_route": {k: max(v) for k, v in sorted(by_route.items())},
        "harnesses": {r["harness"]: {k: v for k, v in r.items() if k != "harness"} for r in rows},
        "skipped": skipped,
    }
    print_table(f"harnesses through the gateway (scripted engine; {args.where})",
                [{k: v for k, v in r.items() if k != "error_detail"} for r in rows])  # fmt: skip
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    for r in rows:
        for detail in r["error_detail"]:
            print(f"error {r['harness']}: {detail}")
    print(f"harnesses token-exact: {len(exact)} of {len(rows)}")
    write_json(args.json, figures)
    return 0


def _on_host(args: argparse.Namespace, names: list[str], tasks: int, tmp: Path) -> tuple[list[Row], dict[str, str]]:
    ready: list[tuple[Harness, str]] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            ready.append((HARNESSES[name], HARNESSES[name].install()))
        except HarnessUnavailable as e:
            skipped[name] = str(e)
    if not ready:
        return [], skipped
    with stack(tmp, [h for h, _ in ready], tasks) as st:
        rows = [measure_harness(h, partial(run_episode, st, h, exe, tmp=tmp, timeout_s=args.timeout_s), tasks)
                for h, exe in ready]  # fmt: skip
    return rows, skipped


def _inside(args: argparse.Namespace, names: list[str], tasks: int, tmp: Path) -> tuple[list[Row], dict[str, str]]:
    skipped = ensure_bundles(args.bundles, names)
    hows: dict[str, Inside] = {}
    for name in names:
        try:
            hows[name] = inside(name, openai_sdk_example() if name == "openai-sdk" else "")
        except HarnessUnavailable as e:
            skipped[name] = str(e)
    ready = [HARNESSES[n] for n in names if n not in skipped]
    if not ready:
        return [], skipped
    with stack(tmp, ready, tasks) as st, local_broker(tmp / "logs", st.redis_url, args.bundles) as broker:
        rows = [measure_harness(h, partial(run_episode_inside, st, broker, h, hows[h.name], timeout_s=args.timeout_s),
                                tasks) for h in ready]  # fmt: skip
    return rows, skipped

"""``rollout bench codec``: trajectory encode + XADD + XREADGROUP + decode through Redis.

The round trip a trainer depends on: a worker encodes and publishes, a trainer reads and
decodes. Target: a 64K-token trajectory in under 5 ms p50 on a 2-core machine.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import redis
from tqdm import tqdm

from services.benchmarks.report import percentile, write_json
from services.protocol import (
    Status,
    Trajectory,
    Turn,
    from_stream_fields,
    logprobs,
    mask,
    to_stream_fields,
    token_ids,
)
from services.runtime.redis_server import redis_url_or_embedded
from services.runtime.tables import print_table

STREAM = "rollout:bench:{codec}:traj"
GROUP = "bench"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("codec", help="trajectory encode + XADD + XREADGROUP + decode round trip")
    p.add_argument("--n-8k", type=int, default=1000, help="trajectories of 8,192 tokens (default 1000)")
    p.add_argument("--n-64k", type=int, default=100, help="trajectories of 65,536 tokens (default 100)")
    p.add_argument("--redis-url", default=None, help="default: an embedded server")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=run)


def make_trajectory(rng: random.Random, total_tokens: int, index: int) -> Trajectory:
    """A trajectory shaped like an agent episode: a 1K prompt, then turns of model and tool tokens."""
    prompt_len = min(1024, total_tokens // 8)
    n = total_tokens - prompt_len
    ids = token_ids(rng.randrange(151_000) for _ in range(n))
    loss = mask()
    lps = logprobs()
    turns: list[Turn] = []
    pos = 0
    while pos < n:
        gen = min(n - pos, rng.randint(50, 600))
        obs = min(n - pos - gen, rng.randint(20, 400))
        turns.append(
            Turn(
                index=len(turns),
                response_offset=pos,
                response_tokens=gen,
                prompt_tokens=prompt_len + pos,
                weight_version="v7",
                engine_id="engine-3",
                finish_reason="stop",
                llm_s=3.5,
                exec_s=0.4,
                exit_code=0,
                observation_tokens=obs,
            )
        )
        loss.extend([1] * gen + [0] * obs)
        lps.extend([-rng.random() for _ in range(gen)] + [0.0] * obs)
        pos += gen + obs
    return Trajectory(
        trajectory_id=f"bench:task-{index}:0", attempt=1, job="bench", rollout_id="bench",
        task_id=f"task-{index}", group_id=f"bench:task-{index}", sample_index=0, group_size=8,
        status=Status.COMPLETED, reward=1.0, prompt_ids=token_ids(rng.randrange(151_000) for _ in range(prompt_len)),
        response_ids=ids, loss_mask=loss, response_logprobs=lps, turns=turns,
    )  # fmt: skip


def roundtrip(client: redis.Redis, traj: Trajectory) -> tuple[float, int]:
    """One publish + consume; returns (seconds, body bytes)."""
    start = time.perf_counter()
    fields = to_stream_fields(traj)
    client.xadd(STREAM, fields)  # type: ignore[arg-type]
    reply: Any = client.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=1)
    entry_id, entry = reply[0][1][0]
    decoded = from_stream_fields(entry)
    client.xack(STREAM, GROUP, entry_id)
    elapsed = time.perf_counter() - start
    if decoded.trajectory_id != traj.trajectory_id or len(decoded.response_ids) != len(traj.response_ids):
        raise AssertionError("round trip changed the trajectory")
    return elapsed, len(fields["body"])


def measure(client: redis.Redis, label: str, count: int, tokens: int, rng: random.Random) -> dict[str, float]:
    samples = [make_trajectory(rng, tokens, i) for i in range(min(count, 20))]
    times: list[float] = []
    total_bytes = 0
    for i in tqdm(range(count), desc=f"round trip {label}", unit="traj", leave=False):
        elapsed, size = roundtrip(client, samples[i % len(samples)])
        times.append(elapsed)
        total_bytes += size
    return {
        "count": count,
        "tokens": tokens,
        "p50_ms": percentile(times, 50) * 1000,
        "p99_ms": percentile(times, 99) * 1000,
        "mean_body_kb": total_bytes / max(count, 1) / 1024,
        "mb_per_s": total_bytes / sum(times) / 1e6 if times else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    with redis_url_or_embedded(args.redis_url) as url:
        client = redis.Redis.from_url(url)
        client.delete(STREAM)
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        try:
            small = measure(client, "8K", args.n_8k, 8_192, rng)
            large = measure(client, "64K", args.n_64k, 65_536, rng)
        finally:
            client.delete(STREAM)
            client.close()
    print_table("trajectory round trip (encode + XADD + XREADGROUP + decode)", [
        {"size": "8K tokens", **small}, {"size": "64K tokens", **large},
    ])  # fmt: skip
    verdict = "meets" if large["p50_ms"] < 5.0 else "MISSES"
    print(f"\n64K p50 {large['p50_ms']:.2f} ms: {verdict} the 5 ms target")
    write_json(args.json, {
        "benchmark": "codec",
        "roundtrip_8k_p50_ms": small["p50_ms"], "roundtrip_8k_p99_ms": small["p99_ms"],
        "roundtrip_64k_p50_ms": large["p50_ms"], "roundtrip_64k_p99_ms": large["p99_ms"],
        "mb_per_s_8k": small["mb_per_s"], "mb_per_s_64k": large["mb_per_s"],
        "body_kb_8k": small["mean_body_kb"], "body_kb_64k": large["mean_body_kb"],
    })  # fmt: skip
    return 0

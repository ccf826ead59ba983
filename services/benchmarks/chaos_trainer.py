"""The trainer of ``rollout bench chaos``: a consumer of a job's trajectory stream that a scenario
kills -9 and starts again. It replays what its group still has pending (``reclaim``), then reads
new entries; each entry is written to ``--out`` (flushed and fsynced: its fate is durable) before
it is acknowledged, so a kill between the two delivers it again, and a kill before the write
leaves it pending for the replay. The bench checks that every trajectory reached the file and that
nothing stays pending.

``python -m services.benchmarks.chaos_trainer --redis-url URL --job JOB --out FILE``
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from rollout_client.stream import Entry, TrajectoryConsumer
from services.runtime.sync_redis import open_sync_redis


def record(out: Path, consumer: TrajectoryConsumer, entries: list[Entry]) -> None:
    if not entries:
        return
    with out.open("a") as file:
        for entry in entries:
            trajectory = entry.trajectory.trajectory_id if entry.trajectory else "-"
            file.write(f"{entry.entry_id} {trajectory}\n")
        file.flush()
        os.fsync(file.fileno())
    consumer.ack(e.entry_id for e in entries)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos_trainer")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--consumer", default="trainer-0")
    args = p.parse_args(argv)
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    consumer = TrajectoryConsumer(open_sync_redis(args.redis_url), args.job, consumer=args.consumer)
    consumer.ensure_group()
    record(args.out, consumer, consumer.reclaim())
    args.out.with_suffix(".ready").touch()
    while not stopping:
        record(args.out, consumer, consumer.read(count=4, block_ms=200))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A short CPU training run against a real Redis stream and a stand-in API/proxy; prints the step breakdown.

    python -m tests.trainer.cpu_run --steps 8 --out runs/trainer-cpu

Embedded Redis, the fake fleet of :mod:`tests.trainer.fake_fleet` (trajectories of random tokens
stamped with the proxy's current version) and ``trainer_client.main.run`` with a small Llama-style
model. Writes ``steps.jsonl``, ``steps.png`` and ``breakdown.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from services.protocol.api import JobCreate
from services.protocol.tasks import RewardSpec, Task
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tokenizer import write_tokenizer_dir
from tests.trainer.fake_fleet import serve_fleet
from trainer_client.main import run
from trainer_client.metrics import PHASES, StepLog
from trainer_client.model import ModelConfig
from trainer_client.settings import TrainSettings

MODEL = ModelConfig(hidden_size=256, num_layers=4, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=688,
                    max_position_embeddings=1024)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/trainer-cpu"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    tasks = args.out / "tasks.jsonl"
    tasks.parent.mkdir(parents=True)
    tasks.write_text("".join(Task(id=f"t{i}", prompt="p", reward=RewardSpec(command="true")).model_dump_json() + "\n"
                             for i in range(16)))  # fmt: skip
    shape = {"prompt_len": 64, "turns": 4, "gen_len": 48, "obs_len": 32}  # 64 + 4x48 generated + 3x32 tool = 352
    with EmbeddedRedis() as redis_server, serve_fleet(redis_server.url, **shape) as (url, fleet):
        fleet.jobs["cpu-run"] = JobCreate(job="cpu-run")  # the trainer reads the job's pool from the API
        settings = TrainSettings(
            job="cpu-run", redis_url=redis_server.url, api_url=url, tasks_path=tasks, proxy_url=url,
            tokenizer_dir=write_tokenizer_dir(args.out / "tokenizer"), work_dir=args.out, model=MODEL,
            group_size=8, batch_groups=2, max_staleness=1, overprovision=2.0, micro_batch_tokens=2048,
            max_steps=args.steps, checkpoint_every=2, wait_timeout_s=60,
        )  # fmt: skip
        run(settings)
    records = StepLog(settings.step_log).read()
    steady = records[1:] or records  # step 1 carries one-off start-up costs
    table = {p: statistics.median(r.timings[p] for r in steady) for p in (*PHASES, "total_s")}
    print(f"{'step':>4} " + " ".join(f"{p.removesuffix('_s'):>14}" for p in (*PHASES, "total_s")))
    for r in records:
        print(f"{r.step:>4} " + " ".join(f"{r.timings[p]:>14.3f}" for p in (*PHASES, "total_s")))
    print("median " + " ".join(f"{table[p]:>14.3f}" for p in (*PHASES, "total_s")))
    (args.out / "breakdown.json").write_text(json.dumps({"median_s": table, "steps": len(records)}, indent=2))


if __name__ == "__main__":
    main()

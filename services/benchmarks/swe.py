"""``rollout bench swe``: every shipped SWE-style task (``rollout tasks build``) through the real API,
a worker, the proxy, a scripted engine and the broker's local backend with the task images as the
sandboxes' root, with a scripted agent in three modes: the gold patch (reward must be 1), a no-op
(0) and tampering with the failing tests (0: they are put back before scoring)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from services.benchmarks.fleet_stack import Stack
from services.benchmarks.report import write_json
from services.protocol import Trajectory
from services.rollout_api.dump import stream_entries
from services.rollout_api.swebench import template_for
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tokenizer import write_tokenizer_dir

ADMIN = "bench-admin"
SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
MODES = ("gold", "noop", "tamper")
TAMPER = """python3 - <<'ROLLOUT_EOF'
import re
path = {path!r}
text = open(path).read()
text = re.sub(r"^(\\s*)def (test\\w*)\\(([^)]*)\\):[^\\n]*\\n", lambda m: m.group(0) + m.group(1) + "    return\\n",
              text, flags=re.M)
open(path, "w").write(text)
ROLLOUT_EOF"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("swe", help="shipped SWE-style tasks end to end: gold / no-op / tamper rewards")
    p.add_argument("--tasks-dir", type=Path, default=None, help="output of `rollout tasks build` (default: built)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rollout" / "tasks")
    p.add_argument("--only", nargs="*", default=None, help="task ids (default: all)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    instances = load_tasks(args)
    root = Path(tempfile.mkdtemp(prefix="rollout-bench-swe-"))
    root.chmod(0o755)
    try:
        with EmbeddedRedis() as server:
            figures = measure(args, instances, root, server.url)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    write_json(args.json, figures)
    ok = figures["gold_reward_mean"] == 1.0 and figures["noop_reward_mean"] == figures["tamper_reward_mean"] == 0.0
    return 0 if ok and figures["infra_errors"] == 0 else 1


def load_tasks(args: argparse.Namespace) -> list[dict[str, Any]]:
    tasks_dir = args.tasks_dir or args.cache / "built"
    if not (tasks_dir / "tasks.json").exists():
        from services.taskbuild.builder import build

        build(tasks_dir, args.cache)
    instances: list[dict[str, Any]] = json.loads((tasks_dir / "tasks.json").read_text())
    return [i for i in instances if not args.only or i["instance_id"] in args.only]


def script_rules(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules = []
    for instance in instances:
        test_file = instance["test_file"]
        patch = f"cat > /tmp/gold.patch <<'ROLLOUT_EOF'\n{instance['patch']}ROLLOUT_EOF\ngit apply /tmp/gold.patch"
        gold = f"```bash\n{patch}\n```"
        replies = {"gold": [gold, SUBMIT], "noop": [SUBMIT],
                   "tamper": [f"```bash\n{TAMPER.format(path=test_file)}\n```", SUBMIT]}  # fmt: skip
        rules += [{"match": marker(instance, mode), "replies": replies[mode]} for mode in MODES]
    return rules


def marker(instance: dict[str, Any], mode: str) -> str:
    return f"RUN-MODE {mode} {instance['instance_id']}."


def measure(args: argparse.Namespace, instances: list[dict[str, Any]], root: Path, redis_url: str) -> dict[str, Any]:
    script = root / "script.json"
    script.write_text(json.dumps({"rules": script_rules(instances), "default": SUBMIT, "latency_s": 0.0}))
    model = write_tokenizer_dir(root / "model")
    (root / "logs").mkdir()
    (root / "state").mkdir(mode=0o755)
    stack = Stack(root / "logs", {**_env(), "ROLLOUT_REDIS_URL": redis_url, "ROLLOUT_API_ADMIN_TOKEN": ADMIN})
    try:
        engine = stack.start("engine", ["engine", "--mode", "scripted", "--script", str(script), "--model-path",
                                        str(model), "--port", "{port}"], health="/health").url  # fmt: skip
        proxy = stack.start("proxy", ["proxy", "--port", "{port}", "--workers", "1", "--engines", engine]).url
        broker = stack.start("broker", ["broker", "--port", "{port}", "--backend", "local", "--redis-url", redis_url,
                                        "--state-dir", str(root / "state")]).url  # fmt: skip
        api = stack.start("api", ["api", "--port", "{port}", "--redis-url", redis_url]).url
        for _ in range(args.workers):
            stack.start("worker", ["worker", "--port", "{port}", "--redis-url", redis_url, "--proxy-url", proxy,
                                   "--broker-url", broker, "--model-path", str(model)])  # fmt: skip
        prepare = register_templates(broker, instances)
        results = {mode: run_mode(api, redis_url, instances, mode) for mode in MODES}
    finally:
        stack.stop()
    return summary(instances, results, prepare)


def register_templates(broker: str, instances: list[dict[str, Any]]) -> list[float]:
    """One template per task image, and the time of each image's first lease (unpacking included)."""
    took = []
    with httpx.Client(base_url=broker, timeout=900) as http:
        for instance in instances:
            name = template_for(instance["image_name"])
            http.post("/templates", json={"name": name, "image": instance["image_path"]}).raise_for_status()
            started = time.monotonic()
            lease = http.post("/leases", json={"template": name, "wait_s": 600})
            lease.raise_for_status()
            took.append(time.monotonic() - started)
            http.delete(f"/leases/{lease.json()['id']}")
    return took


def run_mode(api: str, redis_url: str, instances: list[dict[str, Any]], mode: str) -> list[Trajectory]:
    job = f"swe-{mode}"
    with httpx.Client(base_url=api, timeout=60) as http:
        created = http.post("/jobs", json={"job": job}, headers={"Authorization": f"Bearer {ADMIN}"})
        created.raise_for_status()
        headers = {"Authorization": f"Bearer {created.json()['token']}"}
        rows = [{**i, "problem_statement": f"{i['problem_statement']}\n\n{marker(i, mode)}"} for i in instances]
        body = {"job": job, "instances": rows, "group_size": 1, "test_command": instances[0]["test_command"],
                "limits": {"max_turns": 5, "command_timeout_s": 300}}  # fmt: skip
        response = http.post("/rollouts/swebench", json=body, headers=headers)
        response.raise_for_status()
        rollout = response.json()["rollout_id"]
        while True:
            status = http.get(f"/rollouts/{rollout}", headers=headers).json()
            if status["finished"] >= status["total"]:
                break
            time.sleep(0.5)
    client = redis.Redis.from_url(redis_url)
    try:
        return [traj for _, traj in stream_entries(client, job)]
    finally:
        client.close()


def summary(
    instances: list[dict[str, Any]], results: dict[str, list[Trajectory]], prepare: list[float]
) -> dict[str, Any]:
    def reward_mean(mode: str) -> float | None:
        scored = [t.reward for t in results[mode] if t.status.trainable and t.reward is not None]
        return round(statistics.fmean(scored), 4) if scored else None

    every = [t for mode in MODES for t in results[mode]]
    durations = sorted(t.timings.total_s for t in every if t.status.trainable)
    return {
        "tasks": len(instances),
        "libraries": len({i["repo"] for i in instances}),
        **{f"{mode}_reward_mean": reward_mean(mode) for mode in MODES},
        "infra_errors": sum(1 for t in every if t.status.value == "infra_error"),
        "episode_p50_s": round(statistics.median(durations), 3) if durations else None,
        "image_prepare_s": round(prepare[0], 3) if prepare else None,  # the first image: base layers too
        "image_prepare_next_mean_s": round(statistics.fmean(prepare[1:]), 3) if len(prepare) > 1 else None,
        "docker_gold_reward_mean": None,  # not run: see docs/tasks.md
        "per_task": {
            t.task_id: {m: next((x.reward for x in results[m] if x.task_id == t.task_id), None) for m in MODES}
            for t in results["gold"]
        },  # fmt: skip
    }


def _env() -> dict[str, str]:
    return dict(os.environ)

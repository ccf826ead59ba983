"""``rollout bench swe``: every shipped SWE-style task (``rollout tasks build``) through the real API,
a worker, the proxy, a scripted engine and the broker, with a scripted agent in three modes: the
gold patch (reward must be 1), a no-op (0) and tampering with the failing tests (0: they are put
back before scoring); with ``--attacks`` also every known attack on the grader
(``services/benchmarks/attacks.py``: each must score 0). Once per backend: ``local`` (the task
images unpacked as the sandboxes' root) and ``docker`` (the same images loaded into a Docker
engine: a private dockerd unless ``--docker-host``); the docker figures carry a ``docker_`` prefix."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from services.benchmarks.attacks import attack_scripts
from services.benchmarks.fleet_stack import Stack
from services.benchmarks.report import write_json
from services.protocol import Trajectory
from services.rollout_api.dump import stream_entries
from services.rollout_api.swebench import patched_files, template_for
from services.runtime.dockerd import private_dockerd
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.secrets import FleetSecrets
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.backends.leftovers import remove_state_dir

SECRETS = FleetSecrets.generate()  # measured with authentication on, as deployed
ADMIN = SECRETS.admin_token
BACKENDS = ("local", "docker")
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
    p.add_argument("--backends", default="local,docker", help="comma-separated: local, docker (default both)")
    p.add_argument("--docker-host", default=None, help="a Docker engine (default: start a private dockerd)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--attacks", action="store_true", help="also every known attack on the grader (each must score 0)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    instances = load_tasks(args)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        raise SystemExit(f"--backends: choose from {', '.join(BACKENDS)} (got {args.backends!r})")
    figures: dict[str, Any] = {"tasks": len(instances), "libraries": len({i["repo"] for i in instances})}
    if args.attacks:
        figures["attacks"] = len(ATTACKS)
    for backend in backends:
        found = run_backend(args, instances, backend)
        prefix = "" if backend == "local" else f"{backend}_"
        figures.update({f"{prefix}{key}": value for key, value in found.items()})
    figures.setdefault("docker_gold_reward_mean", None)  # the key is always there: null when not run
    print(json.dumps(figures, indent=1))
    write_json(args.json, figures)
    return 0 if all(_as_expected(figures, b, args.attacks) for b in backends) else 1


def _as_expected(figures: dict[str, Any], backend: str, attacks: bool) -> bool:
    prefix = "" if backend == "local" else f"{backend}_"
    rewards = [figures.get(f"{prefix}{mode}_reward_mean") for mode in MODES]
    attacked = not attacks or figures.get(f"{prefix}attack_reward_max") == 0.0
    return rewards == [1.0, 0.0, 0.0] and figures.get(f"{prefix}infra_errors") == 0 and attacked


def run_backend(args: argparse.Namespace, instances: list[dict[str, Any]], backend: str) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"rollout-bench-swe-{backend}-"))
    root.chmod(0o755)
    try:
        with engine_for(args, backend) as docker_env, EmbeddedRedis(password=SECRETS.redis_password) as server:
            if isinstance(docker_env, str):
                return {"gold_reward_mean": None, "skipped": docker_env}
            return measure(args, instances, root, server.url, backend, docker_env)
    finally:  # the broker keeps the sandboxes of leases still live when it stops: they go here
        remove_state_dir(root / "state")
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def engine_for(args: argparse.Namespace, backend: str) -> Iterator[dict[str, str] | str]:
    """The broker's settings for the Docker engine it uses (none on ``local``), or why there is none."""
    if backend != "docker":
        yield {}
    elif args.docker_host:
        yield {"ROLLOUT_BROKER_DOCKER_HOST": args.docker_host}
    else:
        with private_dockerd() as daemon:
            if isinstance(daemon, str):
                yield daemon
            else:
                yield {"ROLLOUT_BROKER_DOCKER_HOST": daemon.url, "ROLLOUT_BROKER_DOCKER_EXEC_ROOT": daemon.exec_root}


def load_tasks(args: argparse.Namespace) -> list[dict[str, Any]]:
    tasks_dir = args.tasks_dir or args.cache / "built"
    if not (tasks_dir / "tasks.json").exists():
        from services.taskbuild.builder import build

        build(tasks_dir, args.cache)
    instances: list[dict[str, Any]] = json.loads((tasks_dir / "tasks.json").read_text())
    return [i for i in instances if not args.only or i["instance_id"] in args.only]


ATTACKS = tuple(attack_scripts("t.py", "s.py"))  # the attacks' names


def script_rules(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules = []
    for instance in instances:
        test_file = instance["test_file"]
        patch = f"cat > /tmp/gold.patch <<'ROLLOUT_EOF'\n{instance['patch']}ROLLOUT_EOF\ngit apply /tmp/gold.patch"
        gold = f"```bash\n{patch}\n```"
        replies = {"gold": [gold, SUBMIT], "noop": [SUBMIT],
                   "tamper": [f"```bash\n{TAMPER.format(path=test_file)}\n```", SUBMIT]}  # fmt: skip
        attacks = attack_scripts(test_file, patched_files(instance["patch"])[0])
        replies |= {name: [f"```bash\n{script}```", SUBMIT] for name, script in attacks.items()}
        rules += [{"match": marker(instance, mode), "replies": replies[mode]} for mode in replies]
    return rules


def marker(instance: dict[str, Any], mode: str) -> str:
    return f"RUN-MODE {mode} {instance['instance_id']}."


def measure(
    args: argparse.Namespace, instances: list[dict[str, Any]], root: Path, redis_url: str, backend: str,
    backend_env: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    script = root / "script.json"
    script.write_text(json.dumps({"rules": script_rules(instances), "default": SUBMIT, "latency_s": 0.0}))
    model = write_tokenizer_dir(root / "model")
    (root / "logs").mkdir()
    (root / "state").mkdir(mode=0o755)
    images = sorted({str(Path(i["image_path"]).resolve().parent) for i in instances})
    roots = {"ROLLOUT_BROKER_TEMPLATE_ROOTS": ":".join(images)}
    slow_first = {"ROLLOUT_BROKER_CREATE_TIMEOUT_S": "900"}  # a first lease unpacks (or loads) its image
    env = {**_env(), **SECRETS.env(), **backend_env, "ROLLOUT_REDIS_URL": redis_url, **roots, **slow_first}
    stack = Stack(root / "logs", env)
    try:
        engine = stack.start("engine", ["engine", "--mode", "scripted", "--script", str(script), "--model-path",
                                        str(model), "--port", "{port}"], health="/health").url  # fmt: skip
        proxy = stack.start("proxy", ["proxy", "--port", "{port}", "--workers", "1", "--engines", engine]).url
        broker = stack.start("broker", ["broker", "--port", "{port}", "--backend", backend, "--redis-url", redis_url,
                                        "--state-dir", str(root / "state")]).url  # fmt: skip
        api = stack.start("api", ["api", "--port", "{port}", "--redis-url", redis_url]).url
        for _ in range(args.workers):
            stack.start("worker", ["worker", "--port", "{port}", "--redis-url", redis_url, "--proxy-url", proxy,
                                   "--broker-url", broker, "--model-path", str(model)])  # fmt: skip
        prepare = register_templates(broker, instances)
        modes = (*MODES, *ATTACKS) if args.attacks else MODES
        results = {mode: run_mode(api, redis_url, instances, mode) for mode in modes}
    finally:
        stack.stop()
    return summary(results, prepare)


def register_templates(broker: str, instances: list[dict[str, Any]]) -> list[float]:
    """One template per task image, and the time of each image's first lease (unpacking included)."""
    took = []
    with httpx.Client(base_url=broker, timeout=900, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        for instance in instances:
            name = template_for(instance["image_name"])
            http.post("/templates", json={"name": name, "image": instance["image_path"]}).raise_for_status()
            started = time.monotonic()
            lease = http.post("/leases", json={"template": name, "wait_s": 600})
            if lease.status_code != 201:
                raise RuntimeError(f"first lease of {name}: {lease.status_code} {lease.text}")
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


def summary(results: dict[str, list[Trajectory]], prepare: list[float]) -> dict[str, Any]:
    def reward_mean(mode: str) -> float | None:
        scored = [t.reward for t in results[mode] if t.status.trainable and t.reward is not None]
        return round(statistics.fmean(scored), 4) if scored else None

    every = [t for mode in results for t in results[mode]]
    durations = sorted(t.timings.total_s for t in every if t.status.trainable)
    graded = [t.timings.grade_s for t in every if t.timings.grade_s > 0]
    attacked = {mode: reward_mean(mode) for mode in results if mode in ATTACKS}
    attacks = {"attack_rewards": attacked, "attack_reward_max": max(
        (r if r is not None else 1.0 for r in attacked.values()), default=None)} if attacked else {}  # fmt: skip
    return {
        **attacks,  # every attack's mean reward (null: none scored), and the largest (a null counts as 1)
        "grade_s_p50": round(statistics.median(graded), 3) if graded else None,  # fresh grading's sandbox
        **{f"{mode}_reward_mean": reward_mean(mode) for mode in MODES},  # over the scored episodes only
        **{f"{mode}_scored": sum(1 for t in results[mode] if t.status.trainable) for mode in MODES},
        "infra_errors": sum(1 for t in every if t.status.value == "infra_error"),
        "infra_error_samples": sorted({_why(t) for t in every if t.infra is not None})[:8],
        "episode_p50_s": round(statistics.median(durations), 3) if durations else None,
        "image_prepare_s": round(prepare[0], 3) if prepare else None,  # the first image: base layers too
        "image_prepare_next_mean_s": round(statistics.fmean(prepare[1:]), 3) if len(prepare) > 1 else None,
        "per_task": {
            t.task_id: {m: next((x.reward for x in results[m] if x.task_id == t.task_id), None) for m in MODES}
            for t in results["gold"]
        },  # fmt: skip
    }


def _why(t: Trajectory) -> str:
    assert t.infra is not None
    return f"{t.task_id}: {t.infra.stage}/{t.infra.code}: {t.infra.message[:300]}"


def _env() -> dict[str, str]:
    return dict(os.environ)

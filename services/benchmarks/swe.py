"""``rollout bench swe``: every shipped SWE-style task (``rollout tasks build``) through the real API,
a worker, the proxy, a scripted engine and the broker, with a scripted agent in three modes: the
gold patch (reward must be 1), a no-op (0) and tampering with the failing tests (0: they are put
back before scoring); with ``--attacks`` also every known attack on the grader
(``services/benchmarks/attacks.py``: each must score 0, or end as an infra error where it is meant
to exhaust the sandbox). Every mode runs on both routes: the SWE route (``POST /rollouts/swebench``)
and the plain one (``POST /rollouts``, a ``Task`` per instance as docs/tasks.md packages one, graded
with ``"grade_in": "fresh"``; its figures carry a ``plain_`` prefix). Once per backend: ``local`` (the task
images unpacked as the sandboxes' root) and ``docker`` (the same images loaded into a Docker
engine: a private dockerd unless ``--docker-host``); the first backend's figures have no prefix, each
other's carry its name (``docker_``)."""

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

from services.benchmarks import swe_formats
from services.benchmarks.attacks import EXHAUSTION, attack_scripts
from services.benchmarks.fleet_stack import Stack
from services.benchmarks.report import write_json
from services.environments.swe_built_rows import FORMATS
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
ROUTES = {"swe": "/rollouts/swebench", "plain": "/rollouts"}
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
    p.add_argument("--formats", type=swe_formats.parse, default=[],
                   help="also the tasks as instance files of these SWE formats (comma-separated, or all: "
                        f"{', '.join(FORMATS)}), gold and no-op on the SWE route")  # fmt: skip
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
        prefix = _prefix(backend, backends)
        figures.update({f"{prefix}{key}": value for key, value in found.items()})
    figures["backend"] = backends[0]  # the backend of the figures without a prefix
    if "docker" not in backends:
        figures["docker_gold_reward_mean"] = None  # the key is always there: null when not run
    print(json.dumps(figures, indent=1))
    write_json(args.json, figures)
    return 0 if all(_as_expected(figures, _prefix(b, backends), args.attacks) for b in backends) else 1


def _prefix(backend: str, backends: list[str]) -> str:
    return "" if backend == backends[0] else f"{backend}_"


def _as_expected(figures: dict[str, Any], prefix: str, attacks: bool) -> bool:
    rewards = [figures.get(f"{prefix}{route}{mode}_reward_mean") for route in ("", "plain_") for mode in MODES]
    attacked = not attacks or figures.get(f"{prefix}attack_reward_max") == 0.0
    formats = figures.get(f"{prefix}formats", {})
    every_format = sorted(figures.get(f"{prefix}formats_ok", [])) == sorted(formats)
    return rewards == [1.0, 0.0, 0.0] * 2 and figures.get(f"{prefix}infra_errors") == 0 and attacked and every_format


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
    derived = swe_formats.prepare(instances, args.formats, marker) if args.formats else None
    images = sorted({str(Path(i["image_path"]).resolve().parent) for i in instances})
    images += sorted({str(path.parent) for path in derived.images.values()}) if derived else []
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
        if derived:
            swe_formats.register(broker, ADMIN, derived)
        results, by_format = run_modes(api, redis_url, instances, modes, derived)
    finally:
        stack.stop()
    return {**summary(results, prepare), **(swe_formats.summary(derived, by_format) if derived else {})}


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


def run_modes(
    api: str,
    redis_url: str,
    instances: list[dict[str, Any]],
    modes: tuple[str, ...],
    derived: swe_formats.Prepared | None = None,
) -> tuple[dict[str, dict[str, list[Trajectory]]], dict[str, list[Trajectory]]]:
    """Every mode on both routes, and each format's file (``derived``), all submitted at once:
    route -> mode -> its trajectories, and format -> its trajectories."""
    submitted = {(route, mode): submit(api, instances, route, mode) for route in ROUTES for mode in modes}
    files = derived.files if derived else {}
    for fmt, path in files.items():
        headers = create_job(api, f"swe-format-{fmt}")
        test_command = instances[0]["test_command"]
        for rollout in swe_formats.submit(api, headers, f"swe-format-{fmt}", path, fmt, test_command):
            submitted[("format", f"{fmt} {rollout}")] = headers, rollout
    with httpx.Client(base_url=api, timeout=60) as http:
        for headers, rollout in submitted.values():
            while True:
                status = http.get(f"/rollouts/{rollout}", headers=headers).json()
                if status["finished"] >= status["total"]:
                    break
                time.sleep(0.5)
    client = redis.Redis.from_url(redis_url)
    try:
        found: dict[str, dict[str, list[Trajectory]]] = {route: {} for route in ROUTES}
        for route, mode in submitted:
            if route in ROUTES:
                found[route][mode] = [traj for _, traj in stream_entries(client, f"swe-{route}-{mode}")]
        by_format = {fmt: [traj for _, traj in stream_entries(client, f"swe-format-{fmt}")] for fmt in files}
        return found, by_format
    finally:
        client.close()


def create_job(api: str, job: str) -> dict[str, str]:
    """The job, created with the admin token; its own token's header."""
    with httpx.Client(base_url=api, timeout=60) as http:
        created = http.post("/jobs", json={"job": job}, headers={"Authorization": f"Bearer {ADMIN}"})
        created.raise_for_status()
        return {"Authorization": f"Bearer {created.json()['token']}"}


def submit(api: str, instances: list[dict[str, Any]], route: str, mode: str) -> tuple[dict[str, str], str]:
    job = f"swe-{route}-{mode}"
    headers = create_job(api, job)
    with httpx.Client(base_url=api, timeout=60) as http:
        limits = {"max_turns": 5, "command_timeout_s": 300}
        if route == "swe":
            rows = [{**i, "problem_statement": f"{i['problem_statement']}\n\n{marker(i, mode)}"} for i in instances]
            body = {"instances": rows, "test_command": instances[0]["test_command"]}
        else:
            body = {"tasks": [plain_task(i, mode) for i in instances]}
        response = http.post(
            ROUTES[route], json={"job": job, "group_size": 1, "limits": limits, **body}, headers=headers
        )
        response.raise_for_status()
        return headers, response.json()["rollout_id"]


def plain_task(instance: dict[str, Any], mode: str) -> dict[str, Any]:
    """An instance as a plain ``Task`` (docs/tasks.md): the image's working directory, the tests named,
    graded from the agent's diff in a fresh sandbox."""
    ids = [*instance["FAIL_TO_PASS"], *instance["PASS_TO_PASS"]]
    files = " ".join(sorted({t.split("::", 1)[0] for t in ids}))
    tests = {"fail_to_pass": instance["FAIL_TO_PASS"], "pass_to_pass": instance["PASS_TO_PASS"], "log_parser": "pytest"}
    return {
        "id": instance["instance_id"],
        "prompt": f"{instance['problem_statement']}\n\n{marker(instance, mode)}",
        "sandbox": {"template": template_for(instance["image_name"])},
        "reward": {"command": instance["test_command"].format(files=files), "grade_in": "fresh", "tests": tests},
    }


def summary(results: dict[str, dict[str, list[Trajectory]]], prepare: list[float]) -> dict[str, Any]:
    def reward_mean(episodes: list[Trajectory]) -> float | None:
        scored = [t.reward for t in episodes if t.status.trainable and t.reward is not None]
        return round(statistics.fmean(scored), 4) if scored else None

    def attack_reward(mode: str, episodes: list[Trajectory]) -> float:
        """The mean reward, an infra error counting 0 where the attack is meant to cause one; any
        other episode without a reward counts 1 (an attack is only shown harmless by a score)."""
        allowed = mode in EXHAUSTION
        values = [t.reward if t.status.trainable and t.reward is not None else 0.0 if allowed and _infra(t) else 1.0
                  for t in episodes]  # fmt: skip
        return round(statistics.fmean(values), 4) if values else 1.0

    every = [t for route in results.values() for mode in route.values() for t in mode]
    durations = sorted(t.timings.total_s for t in every if t.status.trainable)
    graded = [t.timings.grade_s for t in every if t.timings.grade_s > 0]
    attacked = {mode: {route: attack_reward(mode, results[route][mode]) for route in ROUTES}
                for mode in results["swe"] if mode in ATTACKS}  # fmt: skip
    meant = [t for route in results.values() for mode, ts in route.items() if mode in EXHAUSTION for t in ts]
    meant_infra = sum(1 for t in meant if _infra(t))
    attacks = {
        "attack_rewards": attacked,  # attack -> route -> its mean reward
        "attack_reward_max": max((r for by_route in attacked.values() for r in by_route.values()), default=None),
        "attack_infra_errors": meant_infra,  # of the attacks meant to exhaust the sandbox
    } if attacked else {}  # fmt: skip
    figures: dict[str, Any] = {
        **attacks,
        "grade_s_p50": round(statistics.median(graded), 3) if graded else None,  # fresh grading's sandbox
        # outside the attacks meant to cause them
        "infra_errors": sum(1 for t in every if _infra(t)) - meant_infra,
        "infra_error_samples": sorted({_why(t) for t in every if t.infra is not None})[:8],
        "episode_p50_s": round(statistics.median(durations), 3) if durations else None,
        "image_prepare_s": round(prepare[0], 3) if prepare else None,  # the first image: base layers too
        "image_prepare_next_mean_s": round(statistics.fmean(prepare[1:]), 3) if len(prepare) > 1 else None,
    }
    for route, prefix in (("swe", ""), ("plain", "plain_")):
        found = results[route]
        figures |= {f"{prefix}{mode}_reward_mean": reward_mean(found[mode]) for mode in MODES}  # scored ones
        figures |= {f"{prefix}{mode}_scored": sum(1 for t in found[mode] if t.status.trainable) for mode in MODES}
        figures[f"{prefix}per_task"] = {
            t.task_id: {m: next((x.reward for x in found[m] if x.task_id == t.task_id), None) for m in MODES}
            for t in found["gold"]
        }  # fmt: skip
    return figures


def _infra(t: Trajectory) -> bool:
    return t.status.value == "infra_error"


def _why(t: Trajectory) -> str:
    assert t.infra is not None
    return f"{t.task_id}: {t.infra.stage}/{t.infra.code}: {t.infra.message[:300]}"


def _env() -> dict[str, str]:
    return dict(os.environ)

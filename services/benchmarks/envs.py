"""``rollout bench envs``: the Harbor fixture set (tests/environments/harbor_tasks, or ``--harbor-dir``)
imported as ``rollout tasks import harbor`` does (each image built offline over one shared base,
its template registered), then run through the real API, a worker, the proxy, a scripted engine
and the broker (local backend, authentication on) twice: with the oracle (each task's
``solution/solve.sh``: 1.0) and with a no-op agent (0.0). Then one file per SWE instance format
(swe_fixtures.py: SWE-bench, SWE-Gym, SWE-smith, R2E-Gym rows) through ``POST /rollouts/swebench``
as ``rollout tasks import swe`` maps it, with the gold fix (1.0) and a no-op (0.0). Then the
SkyRL-Gym rows of skyrl_fixtures.py, the verifiers environments of verifiers_fixtures.py and the
Atropos environments of atropos_fixtures.py, stepped by the worker (``env`` agents), each against the
reward the package itself gives the same replies.

JSON keys: ``harbor_tasks``, ``harbor_oracle_reward_mean``, ``harbor_noop_reward_mean``,
``infra_errors`` (every source), ``image_build_s_p50`` (per Harbor image, the shared base's
unpacking included), ``episodes`` (every source), ``sources_ok`` (the sources whose every episode
scored as its definition says), ``reward_matches_package`` (the share of episodes whose reward
equals the reference of the set's own definition: the oracle's or gold fix's 1.0, the no-op's
0.0; for SkyRL-Gym the package's own ``make`` / ``init`` / ``step``, for verifiers its own
``rollout`` + ``score_rollout``, for Atropos the environment's own ``collect_trajectories``),
``per_task`` (Harbor)."""

from __future__ import annotations

import argparse
import asyncio
import json
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
from services.environments import atropos, atropos_fixtures, harbor, skyrl_gym, verifiers_env, verifiers_fixtures
from services.environments.fixture_base import HARBOR_FIXTURES, busybox_base
from services.environments.harbor_sets import HarborImport, import_tasks
from services.environments.skyrl_fixtures import REPLIES as SKYRL_REPLIES
from services.environments.skyrl_fixtures import ROWS as SKYRL_ROWS
from services.environments.skyrl_fixtures import package_reward
from services.environments.swe_files import import_files
from services.environments.swe_fixtures import GIT_INIT, ROWS, TEST_COMMAND, calc_images, write_jsonl
from services.protocol import Task, Trajectory
from services.rollout_api.dump import stream_entries
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.secrets import FleetSecrets
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker.backends.leftovers import remove_state_dir

SECRETS = FleetSecrets.generate()
SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
MODES = {"oracle": 1.0, "noop": 0.0}  # the reference reward of each mode
SWE_GOLD = (
    "```bash\nprintf 'def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n' > calc.py\n```"
)
Episode = tuple[str, float, Trajectory]  # source, reference reward, what ran


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("envs", help="the Harbor fixture set end to end: oracle 1.0, no-op 0.0")
    p.add_argument("--harbor-dir", type=Path, default=HARBOR_FIXTURES, help="a directory of Harbor tasks")
    p.add_argument("--base", action="append", default=[], help="IMAGE=BASE (default: ubuntu:24.04 -> a busybox "
                   "base run with the host's /usr)")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="rollout-bench-envs-"))
    root.chmod(0o755)
    try:
        with EmbeddedRedis(password=SECRETS.redis_password) as server:
            figures = measure(args, root, server.url)
    finally:
        remove_state_dir(root / "state")
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    write_json(args.json, figures)
    every_source = len(figures["sources_ok"]) == len(expected_episodes(len(figures["per_task"])))
    return 0 if every_source and figures["infra_errors"] == 0 else 1


def measure(args: argparse.Namespace, root: Path, redis_url: str) -> dict[str, Any]:
    bases = dict(item.split("=", 1) for item in args.base)
    host_usr = not bases
    if host_usr:
        bases = {"ubuntu:24.04": str(busybox_base(root / "base"))}
    done = import_tasks([args.harbor_dir], root / "harbor", root / "cache", bases=bases, host_usr=host_usr)
    rules = [{"match": f"RUN-ORACLE {t.name}\n", "replies": [f"```bash\n{harbor.oracle_command(t)}\n```", SUBMIT]}
             for t in done.loaded] + [{"match": "RUN-NOOP\n", "replies": [SUBMIT]}]  # fmt: skip
    rules += [{"match": "MODE-GOLD", "replies": [SWE_GOLD, SUBMIT]}, {"match": "MODE-NOOP", "replies": [SUBMIT]}]
    rules += [{"match": marker, "replies": replies} for marker, replies in SKYRL_REPLIES.items()]
    rules += [{"match": marker, "replies": replies} for marker, replies in verifiers_fixtures.REPLIES.items()]
    rules += [{"match": marker, "replies": replies} for marker, replies in atropos_fixtures.REPLIES.items()]
    (root / "script.json").write_text(json.dumps({"rules": rules, "default": SUBMIT, "latency_s": 0.0}))
    model = write_tokenizer_dir(root / "model")
    (root / "logs").mkdir()
    (root / "state").mkdir(mode=0o755)
    env = {**SECRETS.env(), "ROLLOUT_REDIS_URL": redis_url, "ROLLOUT_BROKER_TEMPLATE_ROOTS": str(root)}
    stack = Stack(root / "logs", env)
    try:
        script = ["--mode", "scripted", "--script", str(root / "script.json"), "--model-path", str(model)]
        engine = stack.start("engine", ["engine", *script, "--port", "{port}"], health="/health").url
        proxy = stack.start("proxy", ["proxy", "--port", "{port}", "--workers", "1", "--engines", engine]).url
        broker = stack.start("broker", ["broker", "--port", "{port}", "--backend", "local", "--redis-url", redis_url,
                                        "--state-dir", str(root / "state")], timeout_s=120).url  # fmt: skip
        api = stack.start("api", ["api", "--port", "{port}", "--redis-url", redis_url]).url
        stack.start("worker", ["worker", "--port", "{port}", "--redis-url", redis_url, "--proxy-url", proxy,
                               "--broker-url", broker, "--model-path", str(model)])  # fmt: skip
        swe_templates = [{"name": n, "image": str(p), "host_usr": True} for n, p in calc_images(root / "swe").items()]
        register_templates(broker, [*done.templates, *swe_templates])
        results = {mode: run_mode(api, redis_url, done.tasks, mode) for mode in MODES}
        swe = run_swe(api, redis_url, root / "swe") + run_skyrl(api, redis_url) + run_verifiers(api, redis_url)
        swe += run_atropos(api, redis_url, str(model))
    finally:
        stack.stop()
    return summary(done, results, swe)


def register_templates(broker: str, templates: list[dict[str, object]]) -> None:
    headers = {"Authorization": f"Bearer {SECRETS.admin_token}"}
    with httpx.Client(base_url=broker, timeout=120, headers=headers) as http:
        for template in templates:
            http.post("/templates", json=template).raise_for_status()


def run_swe(api: str, redis_url: str, work: Path) -> list[Episode]:
    """Each SWE format's file (a gold and a no-op row) mapped and run through the SWE route."""
    job = "envs-swe"
    with httpx.Client(base_url=api, timeout=60) as http:
        created = http.post("/jobs", json={"job": job}, headers={"Authorization": f"Bearer {SECRETS.admin_token}"})
        created.raise_for_status()
        headers = {"Authorization": f"Bearer {created.json()['token']}"}
        rollouts = []
        for fmt, row in ROWS.items():
            path = write_jsonl(work / f"{fmt}.jsonl", [row("GOLD"), row("NOOP")])
            template = "calc-r2e" if fmt == "r2e-gym" else "calc"
            imported = import_files([path], fmt, job=job, group_size=1, template=template, setup=[GIT_INIT],
                                    test_command=TEST_COMMAND, env={"PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
            for request in imported.requests:
                response = http.post("/rollouts/swebench", json=request.model_dump(mode="json"), headers=headers)
                response.raise_for_status()
                rollouts.append(response.json()["rollout_id"])
        for rollout in rollouts:
            while (status := http.get(f"/rollouts/{rollout}", headers=headers).json())["finished"] < status["total"]:
                time.sleep(0.5)
    client = redis.Redis.from_url(redis_url)
    try:
        return [(t.source, 1.0 if t.task_id.endswith("gold") else 0.0, t) for _, t in stream_entries(client, job)]
    finally:
        client.close()


def run_skyrl(api: str, redis_url: str) -> list[Episode]:
    """The SkyRL-Gym rows through ``env`` agents; each reference is the package's own reward."""
    tasks = skyrl_gym.tasks_from_rows(SKYRL_ROWS)
    trajs = run_mode(api, redis_url, tasks, "skyrl", mark=False)
    reference = {t.id: package_reward(row, SKYRL_REPLIES[t.prompt.split(":")[0]])[0]
                 for t, row in zip(tasks, SKYRL_ROWS, strict=True)}  # fmt: skip
    return [(skyrl_gym.SOURCE, reference[t.task_id], t) for t in trajs]


def run_verifiers(api: str, redis_url: str) -> list[Episode]:
    """The verifiers environments' rows through ``env`` agents; each reference is the package's own reward."""
    tasks = [t.model_copy(update={"id": f"{kind}-{t.id}"}) for kind in verifiers_fixtures.BUILDERS
             for t in verifiers_env.tasks_from_environment(verifiers_fixtures.ENV_ID, {"kind": kind})]  # fmt: skip
    trajs = run_mode(api, redis_url, tasks, "verifiers", mark=False)
    reference = {t.id: asyncio.run(verifiers_fixtures.package_reward(t.id.split("-")[0], t.prompt.split(":")[0]))[0]
                 for t in tasks}  # fmt: skip
    return [(verifiers_env.SOURCE, reference[t.task_id], t) for t in trajs]


def run_atropos(api: str, redis_url: str, tokenizer: str) -> list[Episode]:
    """The Atropos environments' items through ``env`` agents; each reference is the environment's own score."""
    config, fixtures = {"tokenizer_name": tokenizer}, atropos_fixtures
    tasks = [t for name, items in fixtures.ITEMS.items()
             for t in atropos.tasks_from_environment(f"{fixtures.MODULE}:{name}", len(items), config)]  # fmt: skip
    trajs = run_mode(api, redis_url, tasks, "atropos", mark=False)
    items = {i["question"]: (name, i) for name, items in fixtures.ITEMS.items() for i in items}
    reference = {t.id: asyncio.run(fixtures.package_reward(*items[t.prompt], tokenizer)) for t in tasks}
    return [(atropos.SOURCE, reference[t.task_id], t) for t in trajs]


def expected_episodes(harbor_tasks: int) -> dict[str, int]:
    """Episodes per source."""
    verifiers_rows = sum(len(rows) for rows in verifiers_fixtures.QUESTIONS.values())
    atropos_items = sum(len(items) for items in atropos_fixtures.ITEMS.values())
    return {harbor.SOURCE: harbor_tasks * len(MODES), **{fmt: 2 for fmt in ROWS}, skyrl_gym.SOURCE: len(SKYRL_ROWS),
            verifiers_env.SOURCE: verifiers_rows, atropos.SOURCE: atropos_items}  # fmt: skip


def run_mode(api: str, redis_url: str, tasks: list[Task], mode: str, *, mark: bool = True) -> list[Trajectory]:
    job = f"envs-harbor-{mode}" if mark else f"envs-{mode}"
    marked = [t.model_copy(update={"prompt": (f"RUN-ORACLE {t.id}\n" if mode == "oracle" else "RUN-NOOP\n")
                                   + t.prompt}) for t in tasks] if mark else tasks  # fmt: skip
    with httpx.Client(base_url=api, timeout=60) as http:
        created = http.post("/jobs", json={"job": job}, headers={"Authorization": f"Bearer {SECRETS.admin_token}"})
        created.raise_for_status()
        headers = {"Authorization": f"Bearer {created.json()['token']}"}
        body = {"job": job, "group_size": 1, "tasks": [t.model_dump(mode="json") for t in marked],
                "limits": {"max_turns": 5, "command_timeout_s": 300}}  # fmt: skip
        response = http.post("/rollouts", json=body, headers=headers)
        response.raise_for_status()
        rollout = response.json()["rollout_id"]
        while (status := http.get(f"/rollouts/{rollout}", headers=headers).json())["finished"] < status["total"]:
            time.sleep(0.5)
    client = redis.Redis.from_url(redis_url)
    try:
        return [traj for _, traj in stream_entries(client, job)]
    finally:
        client.close()


def summary(done: HarborImport, results: dict[str, list[Trajectory]], swe: list[Episode]) -> dict[str, Any]:
    def reward_mean(mode: str) -> float | None:
        scored = [t.reward for t in results[mode] if t.status.trainable and t.reward is not None]
        return round(statistics.fmean(scored), 4) if scored else None

    every = [(harbor.SOURCE, MODES[mode], t) for mode in MODES for t in results[mode]] + swe
    expected = expected_episodes(len(done.tasks))
    matching = [source for source, reference, t in every if t.reward == reference and t.source == source]
    return {
        "harbor_tasks": len(done.tasks),
        "harbor_oracle_reward_mean": reward_mean("oracle"),
        "harbor_noop_reward_mean": reward_mean("noop"),
        "infra_errors": sum(1 for _, _, t in every if t.infra is not None),
        "image_build_s_p50": round(statistics.median(done.build_s), 3) if done.build_s else None,
        "episodes": len(every),
        "sources_ok": sorted(s for s, n in expected.items() if matching.count(s) == n == sum(e[0] == s for e in every)),
        "reward_matches_package": round(len(matching) / len(every), 4) if every else None,
        "per_task": {
            t.id: {m: next((x.reward for x in results[m] if x.task_id == t.id), None) for m in MODES}
            for t in done.tasks
        },  # fmt: skip
    }

"""``rollout tasks import swe|harbor|skyrl-gym|verifiers|atropos``: the field's task sets as the platform's requests
(services/environments, docs/environments.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = actions.add_parser("import", help="import another project's tasks (SWE instance files, Harbor tasks)")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    swe = kinds.add_parser("swe", help="JSONL of SWE-bench / SWE-Gym / SWE-smith / R2E-Gym rows -> "
                           "POST /rollouts/swebench bodies (one per format)")  # fmt: skip
    swe.add_argument("files", type=Path, nargs="+")
    swe.add_argument("--format", default="auto", help="auto, swebench, swe-gym, swe-smith, r2e-gym (SWE-Gym's rows "
                     "look like SWE-bench's: name it)")  # fmt: skip
    swe.add_argument("--job", required=True)
    swe.add_argument("--template", default=None, help="the broker template of every instance (default: per image)")
    swe.add_argument("--test-command", default=None, help="the route's test_command (rows may carry their own)")
    swe.add_argument("--group-size", type=int, default=None)
    swe.add_argument("--source-version", default=None, help="the set's version (default: the file's content hash)")
    swe.add_argument("--out", type=Path, default=None, help="write the bodies here (a JSON list; default: stdout)")
    swe.set_defaults(handler=import_swe)
    _register_harbor(kinds)
    skyrl = kinds.add_parser("skyrl-gym", help="JSONL of SkyRL dataset rows (prompt, env_class, reward_spec, ...) "
                             "-> a POST /rollouts body of env agents")  # fmt: skip
    skyrl.add_argument("files", type=Path, nargs="+")
    skyrl.add_argument("--job", required=True)
    skyrl.add_argument("--group-size", type=int, default=1)
    skyrl.add_argument("--out", type=Path, default=None, help="write the body here (default: stdout)")
    skyrl.set_defaults(handler=import_skyrl)
    _register_driven(kinds)


def _register_driven(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    vf = kinds.add_parser("verifiers", help="a verifiers environment's dataset (verifiers.load_environment ENV_ID) "
                          "-> a POST /rollouts body of env agents")  # fmt: skip
    vf.add_argument("env_id", help="an installed verifiers environment module")
    vf.add_argument("--env-args", type=json.loads, default={}, help="its load_environment arguments (JSON object)")
    vf.add_argument("--split", choices=["train", "eval"], default="train")
    vf.add_argument("-n", type=int, default=-1, help="rows (default: all)")
    atropos = kinds.add_parser("atropos", help="an Atropos environment's items (module:Class, a BaseEnv subclass) "
                               "-> a POST /rollouts body of env agents")  # fmt: skip
    atropos.add_argument("env", help="module:Class")
    atropos.add_argument("-n", type=int, required=True, help="items (get_next_item, after setup)")
    atropos.add_argument("--config", type=json.loads, default={}, help="overrides of its config (JSON object)")
    for sub in (vf, atropos):
        sub.add_argument("--job", required=True)
        sub.add_argument("--group-size", type=int, default=1)
        sub.add_argument("--out", type=Path, default=None, help="write the body here (default: stdout)")
    vf.set_defaults(handler=import_verifiers)
    atropos.set_defaults(handler=import_atropos)


def _register_harbor(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    harbor = kinds.add_parser("harbor", help="Harbor task directories (Terminal-Bench): build each image offline, "
                              "register its template, write the POST /rollouts body")  # fmt: skip
    harbor.add_argument("dirs", type=Path, nargs="+", help="task directories, or directories of them")
    harbor.add_argument("--out", type=Path, required=True, help="images/ and rollout.json go here")
    harbor.add_argument("--job", default="harbor", help="the job of the written request body")
    harbor.add_argument("--base", action="append", default=[], help="IMAGE=BASE: the local base of a FROM image "
                        "(a path, an image store name or 'mmdebstrap'; repeatable)")  # fmt: skip
    harbor.add_argument("--network", action="store_true", help="RUN steps reach the network (apt-get, pip)")
    harbor.add_argument("--host-usr", action="store_true", help="the templates bind the host's /usr (test bases)")
    harbor.add_argument("--broker-url", default=None, help="register the templates with this broker (admin token "
                        "from ROLLOUT_ADMIN_TOKEN)")  # fmt: skip
    harbor.add_argument("--source-version", default=None, help="the set's version (default: its content hash)")
    harbor.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rollout" / "tasks")
    harbor.add_argument("--state-dir", type=Path, default=None, help="the broker's state dir (store names as bases)")
    harbor.set_defaults(handler=import_harbor)


def import_swe(args: argparse.Namespace) -> int:
    from services.environments.swe_files import FormatError, import_files

    options = {"job": args.job, "template": args.template, "test_command": args.test_command,
               "group_size": args.group_size}  # fmt: skip
    try:
        imported = import_files(args.files, args.format, source_version=args.source_version,
                                **{k: v for k, v in options.items() if v is not None})  # fmt: skip
    except (FormatError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    text = json.dumps([r.model_dump(mode="json", exclude_unset=True) for r in imported.requests], indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    for request in imported.requests:
        source = request.instances[0].source
        print(f"{source}: {len(request.instances)} instances", file=sys.stderr)
    return 0


def import_skyrl(args: argparse.Namespace) -> int:
    from services.environments.skyrl_gym import RowError, tasks_from_rows

    tasks = []
    try:
        for path in args.files:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            tasks += tasks_from_rows(rows, id_prefix=path.stem)
    except (RowError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _write_body(args, tasks, "skyrl-gym")


def import_verifiers(args: argparse.Namespace) -> int:
    from services.environments.verifiers_env import tasks_from_environment

    try:
        tasks = tasks_from_environment(args.env_id, args.env_args, split=args.split, n=args.n)
    except (ImportError, ValueError, KeyError) as exc:  # verifiers raises these for an unknown or bad environment
        print(f"error: {exc!r}", file=sys.stderr)
        return 2
    return _write_body(args, tasks, "verifiers")


def import_atropos(args: argparse.Namespace) -> int:
    from services.environments.atropos import tasks_from_environment

    try:
        tasks = tasks_from_environment(args.env, args.n, args.config)
    except (ImportError, ValueError) as exc:
        print(f"error: {exc!r}", file=sys.stderr)
        return 2
    return _write_body(args, tasks, "atropos")


def _write_body(args: argparse.Namespace, tasks: list[Any], source: str) -> int:
    body = {"job": args.job, "group_size": args.group_size, "tasks": [t.model_dump(mode="json") for t in tasks]}
    text = json.dumps(body, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    print(f"{source}: {len(tasks)} tasks", file=sys.stderr)
    return 0


def import_harbor(args: argparse.Namespace) -> int:
    import os

    import httpx

    from services.cli.images_cmd import _store
    from services.environments.harbor import HarborError
    from services.environments.harbor_sets import import_tasks
    from services.protocol import RolloutRequest

    bases = dict(item.split("=", 1) for item in args.base if "=" in item)
    if len(bases) != len(args.base):
        print("error: --base takes IMAGE=BASE", file=sys.stderr)
        return 2
    names = {name: entry["source"] for name, entry in _store(args).refs().items()}
    try:
        done = import_tasks(args.dirs, args.out, args.cache, bases=bases, network=args.network,
                            host_usr=args.host_usr, source_version=args.source_version, store_names=names)  # fmt: skip
    except (HarborError, ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.broker_url:
        headers = {"Authorization": f"Bearer {os.environ.get('ROLLOUT_ADMIN_TOKEN', '')}"}
        for template in done.templates:
            answer = httpx.post(f"{args.broker_url}/templates", json=template, headers=headers, timeout=60)
            if answer.status_code >= 400:
                print(f"error: registering {template['name']}: {answer.status_code} {answer.text}", file=sys.stderr)
                return 1
    body = RolloutRequest(job=args.job, tasks=done.tasks)
    (args.out / "rollout.json").write_text(body.model_dump_json(indent=1, exclude_defaults=True))
    (args.out / "templates.json").write_text(json.dumps(done.templates, indent=1))
    for task, seconds in zip(done.tasks, done.build_s, strict=True):
        print(f"{task.id:<32} {task.sandbox.template:<40} built in {seconds:.1f}s")
    print(f"{len(done.tasks)} tasks in {args.out / 'rollout.json'}")
    return 0

"""``rollout tasks import swe|harbor``: the field's task sets as the platform's requests
(services/environments, docs/environments.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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

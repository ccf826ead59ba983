"""``rollout deploy check``: render and validate compose.yaml and every k8s overlay."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("deploy", help="deployment files: `rollout deploy check` renders and validates them")
    deploy = p.add_subparsers(dest="deploy_command", required=True, metavar="ACTION")
    check = deploy.add_parser("check", help="render compose.yaml and k8s/overlays/*, validate every object")
    check.add_argument("--json", type=Path, default=None, help="write the report here")
    check.add_argument("--k8s-version", default=None, help="Kubernetes schema version (default: the oldest supported)")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    from services.deploy.check import K8S_VERSION, check

    report = check(args.k8s_version or K8S_VERSION)
    print(f"compose.yaml          {'ok' if report.compose_ok else 'FAILED'}")
    for name in report.overlays_ok:
        print(f"{name:<22}ok")
    for name in report.overlays_failed:
        print(f"{name:<22}FAILED")
    print(f"objects validated     {report.objects_validated} (Kubernetes {args.k8s_version or K8S_VERSION} schemas)")
    print(f"containers checked    {report.containers_checked} (environment loaded into their settings)")
    for message in report.messages:
        print(f"  error: {message}")
    print(f"errors                {report.errors}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    return 1 if report.errors else 0

"""``rollout settings docs [--write]``: the settings tables of docs/settings.md, generated from the
settings classes (printed, or written to the file)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("settings", help="the settings of every process, as documented")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    docs = actions.add_parser("docs", help="print docs/settings.md as generated from the settings classes")
    docs.add_argument("--write", action="store_true", help="write it to docs/settings.md instead")
    docs.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.cli.settings_doc import DOC, render

    text = render()
    if args.write:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    else:
        print(text, end="")
    return 0

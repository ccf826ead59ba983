"""``rollout tokenizer write DIR``: the bundled byte-level tokenizer (and chat template) as a
tokenizer directory, for ``rollout worker --model-path`` and the stand-in engines."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tokenizer", help="write the bundled tokenizer directory")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    write = actions.add_parser("write", help="write tokenizer.json + tokenizer_config.json into DIR")
    write.add_argument("directory", type=Path)
    write.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from services.runtime.tokenizer import write_tokenizer_dir

    directory = write_tokenizer_dir(args.directory)
    print(f"tokenizer written to {directory} (use: rollout worker --model-path {directory})")
    return 0

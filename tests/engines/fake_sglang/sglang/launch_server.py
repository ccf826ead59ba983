"""``python -m sglang.launch_server`` for the launcher test: parses the flags the platform passes
(with SGLang's spelling), records them, and serves a simulated engine on ``--port``."""

from __future__ import annotations

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
for flag in ("--model-path", "--host", "--served-model-name", "--weight-version", "--mem-fraction-static"):
    parser.add_argument(flag)
for flag in ("--port", "--context-length", "--max-running-requests", "--tp-size", "--random-seed"):
    parser.add_argument(flag, type=int)
parser.add_argument("--enable-metrics", action="store_true")
parser.add_argument("--enable-return-routed-experts", action="store_true")
args, unknown = parser.parse_known_args()
with open(os.environ["FAKE_SGLANG_RECORD"], "w") as record:
    json.dump({**vars(args), "unknown": unknown}, record)
from services.cli.main import main  # noqa: E402

sys.exit(main(["engine", "--mode", "sim", "--host", args.host, "--port", str(args.port), "--weight-version",
               args.weight_version, "--context-length", str(args.context_length)]))  # fmt: skip

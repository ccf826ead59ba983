"""The ``rollout`` command line: help, bad usage, and the codec benchmark end to end."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO_ROOT, python_env


def rollout(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], cwd=REPO_ROOT, env=python_env(),
        capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip


def test_help_lists_the_subcommands() -> None:
    out = rollout("--help")
    assert out.returncode == 0
    assert "redis" in out.stdout and "bench" in out.stdout


def test_unknown_subcommand_says_what_to_fix() -> None:
    out = rollout("frobnicate")
    assert out.returncode == 2
    assert "invalid choice: 'frobnicate'" in out.stderr


def test_every_subcommand_is_in_the_lazy_map_and_a_service_imports_only_its_own() -> None:
    from services.cli.main import COMMANDS, build_parser, command_of

    full = build_parser()
    choices = next(a.choices for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert list(choices) == list(COMMANDS)  # a name missing from the map would build every parser
    assert command_of(["--log-level", "DEBUG", "broker", "--port", "1"]) == "broker"
    assert command_of(["--log-level=DEBUG", "api"]) == "api" and command_of(["--help"]) is None
    probe = ("import sys; from services.cli.main import build_parser; "
             "build_parser('broker').parse_args(['broker', '--port', '1']); "
             "print(' '.join(sorted(m for m in sys.modules if m.startswith(('services.cli.', 'services.benchmarks', "
             "'services.llm_proxy', 'torch', 'docker')))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=python_env(), capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    assert out.stdout.split() == ["services.cli.broker_cmd", "services.cli.flags", "services.cli.main"]
    helped = rollout("--log-level", "WARNING", "broker", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: rollout broker"), helped.stdout[:200]


def test_codec_benchmark_writes_its_json(tmp_path: Path, redis_url: str) -> None:
    path = tmp_path / "codec.json"
    out = rollout("bench", "codec", "--n-8k", "20", "--n-64k", "3", "--redis-url", redis_url, "--json", str(path))
    assert out.returncode == 0, out.stderr
    figures = json.loads(path.read_text())
    for key in ("roundtrip_8k_p50_ms", "roundtrip_64k_p50_ms", "roundtrip_64k_p99_ms"):
        assert figures[key] > 0
    # the two sizes were measured apart (their bodies, not their times: 3 samples of 64K against 20 of 8K on
    # a loaded machine ordered either way, a timed assertion that failed a parallel run once)
    assert figures["body_kb_64k"] > 4 * figures["body_kb_8k"] > 0
    assert "64K tokens" in out.stdout

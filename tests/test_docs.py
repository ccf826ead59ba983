"""The command examples of the README and docs/ are checked against the code, so they cannot drift:

- every ``rollout ...`` command parses with the real CLI parser (flags and choices exist);
- every ``ROLLOUT_*`` variable they set is a real setting of the service its prefix names (or a
  shared one);
- every loopback URL points at a port some example starts, or at a service's default port;
- every ``curl`` that sends a body says its content type (FastAPI answers 422 without it).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from services.cli.main import build_parser
from services.deploy.check import settings_classes, unknown_variables
from services.engines.settings import EngineSettings
from services.llm_proxy.settings import ProxySettings
from services.rollout_api.settings import ApiSettings
from services.sandbox_broker.settings import BrokerSettings

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)
DEFAULT_PORTS = {ApiSettings().port, ProxySettings().port, BrokerSettings().port, EngineSettings().port}


def commands(doc: Path) -> list[str]:
    """The shell lines of the doc's fenced blocks, continuations joined, comments dropped."""
    found = []
    for block in FENCE.findall(doc.read_text()):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" # ")[0].strip()
            if line and not line.startswith("#"):
                found.append(line)
    return found


def rollout_argv(line: str) -> list[str] | None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # a quoted argument that goes on past this line: not a command of ours
        words = line.split()
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value prefixes
        words = words[1:]
    return words[1:] if words[:1] == ["rollout"] else None


ALL = [(doc.name, line) for doc in DOCS for line in commands(doc)]


def test_the_docs_have_command_examples() -> None:
    assert sum(1 for _, line in ALL if rollout_argv(line)) >= 5


@pytest.mark.parametrize(("doc", "line"), [a for a in ALL if rollout_argv(a[1])], ids=lambda v: str(v)[:60])
def test_rollout_commands_parse(doc: str, line: str) -> None:
    argv = rollout_argv(line)
    assert argv is not None
    try:
        build_parser().parse_args([a.replace("{port}", "1") for a in argv])
    except SystemExit as exc:
        raise AssertionError(f"{doc}: `{line}` does not parse") from exc


def test_variables_are_real_settings() -> None:
    classes = settings_classes()
    for doc, line in ALL:
        names = {m.group(1): "x" for m in re.finditer(r"\b(ROLLOUT_[A-Z0-9_]+)=", line)}
        assert unknown_variables(names, classes) == [], f"{doc}: {line}"


def test_loopback_ports_are_started_or_defaults() -> None:
    for doc in DOCS:
        lines = commands(doc)
        started = {int(p) for line in lines for p in re.findall(r"--port[ =](\d+)", line)}
        for line in lines:
            for port in re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)", line):
                known = started | DEFAULT_PORTS | {6379}  # 6379: an external Redis
                assert int(port) in known or any(int(port) - p in range(64) for p in started), f"{doc}: {line}"


def test_curl_bodies_say_their_content_type() -> None:
    for doc, line in ALL:
        if line.startswith("curl") and re.search(r"\s(-d|--data)\s", line):
            assert "Content-Type: application/json" in line, f"{doc}: {line}"

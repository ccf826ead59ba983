"""The command examples of the README and docs/ are checked against the code, so they cannot drift:

- every ``rollout ...`` command parses with the real CLI parser (flags and choices exist);
- every ``rollout ...`` written inline in the prose names real subcommands and flags (its
  placeholders, ``PATH``, ``[--port N]``, are allowed);
- every ``ROLLOUT_*`` variable they set is a real setting of the service its prefix names (or a
  shared one);
- every loopback URL points at a port some example starts, or at a service's default port;
- every ``curl`` that sends a body says its content type (FastAPI answers 422 without it).
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from services.cli.main import build_parser
from services.deploy.check import settings_classes, unknown_variables
from services.engines.settings import EngineSettings
from services.llm_proxy.settings import ProxySettings
from services.rollout_api.settings import ApiSettings, WorkerSettings
from services.sandbox_broker.settings import BrokerSettings

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)
# every service's port, and the loopback port an agent in a sandbox reaches its gateway session on
DEFAULT_PORTS = {
    ApiSettings().port,
    ProxySettings().port,
    BrokerSettings().port,
    EngineSettings().port,
    WorkerSettings().sandbox_gateway_port,
}


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


INLINE = re.compile(r"`(rollout(?: [^`]*)?)`")
SHELL_OPERATORS = {">", ">>", "|", "&&", ";", "<"}


def inline_commands(doc: Path) -> list[str]:
    """The ``rollout ...`` commands written inline in the prose (`` `rollout deploy check --json PATH` ``)."""
    return INLINE.findall(doc.read_text())


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_words(command: str) -> list[str]:
    """The subcommands and ``--flags`` of an inline example that the real CLI does not have
    (placeholders such as ``PATH`` and optional groups ``[--port N]`` are allowed)."""
    parsers = [build_parser()]
    unknown: list[str] = []
    try:
        words = shlex.split(command)  # a quoted argument is one word
    except ValueError:
        words = command.split()
    for word in words[1:]:
        if word in SHELL_OPERATORS:
            break
        flag = word.strip("[]").split("=")[0]
        subcommands = _subcommands(parsers[0])
        if flag.startswith("-"):
            unknown += [flag for p in parsers if flag not in p._option_string_actions]
        elif subcommands and re.fullmatch(r"[a-z][a-z0-9|-]*", word):
            names = word.split("|")
            unknown += [name for name in names if name not in subcommands]
            parsers = [subcommands[name] for name in names if name in subcommands] or parsers
    return unknown


INLINE_ALL = [(doc.name, cmd) for doc in DOCS for cmd in inline_commands(doc)]


def test_the_new_docs_are_covered() -> None:
    """The deployment, security, tasks and agents pages have commands this module checks."""
    covered = {doc for doc, _ in INLINE_ALL} | {doc for doc, line in ALL if rollout_argv(line)}
    assert {"deployment.md", "security.md", "tasks.md", "agents.md", "README.md"} <= covered


@pytest.mark.parametrize(("doc", "command"), INLINE_ALL, ids=lambda v: str(v)[:60])
def test_inline_commands_name_real_subcommands_and_flags(doc: str, command: str) -> None:
    assert unknown_words(command) == [], f"{doc}: `{command}`"


def test_the_inline_check_can_fail() -> None:
    assert unknown_words("rollout deploy check --jsn PATH") == ["--jsn"]
    assert unknown_words("rollout bench codec|nosuch") == ["nosuch"]
    assert unknown_words("rollout redis [--port N] [--appendonly]") == []

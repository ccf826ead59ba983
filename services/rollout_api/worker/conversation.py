"""The mini-swe-agent style protocol of the ``bash`` agent: its templates (Jinja2, mini-swe-agent's
variable names, ``StrictUndefined``), parsing one action per reply with the spec's regex, and
turning command output into the next user message. Plain functions over a :class:`BashAgent`."""

from __future__ import annotations

import functools
import platform
import re
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from services.protocol.agents import BASH_OBSERVATION_TEMPLATE, BASH_SYSTEM_TEMPLATE, SUBMIT_MARKER, BashAgent
from services.protocol.sandboxes import ExecResult

SUBMIT_COMMAND = f"echo {SUBMIT_MARKER}"
SYSTEM_PROMPT = BASH_SYSTEM_TEMPLATE
DEFAULT_AGENT = BashAgent()

_ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined)
_UNAME = platform.uname()
_PLATFORM = {"system": _UNAME.system, "release": _UNAME.release, "version": _UNAME.version, "machine": _UNAME.machine}


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Any:
    return _ENV.from_string(source)


@functools.lru_cache(maxsize=64)
def _regex(source: str) -> re.Pattern[str]:
    return re.compile(source, re.DOTALL)


def render(template: str, **variables: Any) -> str:
    """Render one of the agent's templates; mini-swe-agent's platform variables are available too."""
    return str(_compiled(template).render(**(_PLATFORM | variables)))


FORMAT_ERROR = "format error"
NUL_ERROR = "the command contains a NUL byte, which no shell can run"


@dataclass(frozen=True, slots=True)
class Action:
    command: str | None  # the one command, or None when the reply was malformed
    blocks: int  # how many actions the reply had
    marker: str = SUBMIT_MARKER
    error: str = FORMAT_ERROR  # what was wrong (a template may show it as ``{{error}}``)

    @property
    def submits(self) -> bool:
        return self.command is not None and self.command.strip() in (f"echo {self.marker}", "submit")


def parse_action(reply: str, agent: BashAgent = DEFAULT_AGENT) -> Action:
    blocks = _regex(agent.action_regex).findall(reply)
    if len(blocks) != 1:
        return Action(command=None, blocks=len(blocks), marker=agent.submit_marker)
    command = str(blocks[0]).strip()
    if "\x00" in command:  # a policy can sample one; no shell can run it, so it is the model's error, fed back
        return Action(command=None, blocks=1, marker=agent.submit_marker, error=NUL_ERROR)
    return Action(command=command, blocks=1, marker=agent.submit_marker)


def submitted_by_output(result: ExecResult, agent: BashAgent = DEFAULT_AGENT) -> bool:
    """mini-swe-agent's rule: the first line of a successful command's output is the marker."""
    return result.exit_code == 0 and result.stdout.lstrip().startswith(agent.submit_marker)


def system_message(agent: BashAgent = DEFAULT_AGENT) -> str:
    return render(agent.system_template)


def task_message(prompt: str, agent: BashAgent = DEFAULT_AGENT) -> str:
    return render(agent.instance_template, task=prompt)


def format_error(action: Action, agent: BashAgent = DEFAULT_AGENT) -> str:
    message = render(agent.format_error_template, actions=[None] * action.blocks, error=action.error)
    # the default template does not show {{error}}: a specific error goes first
    return message if action.error == FORMAT_ERROR else f"Error: {action.error}.\n{message}"


def truncate_middle(text: str, max_bytes: int) -> str:
    """Keep the head and tail of ``text`` within about ``max_bytes`` UTF-8 bytes."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    keep = max(0, max_bytes - 100) // 2
    head = raw[:keep].decode(errors="ignore")
    tail = raw[len(raw) - keep :].decode(errors="ignore")
    return f"{head}\n[... {len(raw) - 2 * keep} bytes elided ...]\n{tail}"


def observation(result: ExecResult, max_bytes: int, agent: BashAgent = DEFAULT_AGENT) -> str:
    output = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr)
    body = truncate_middle(output, agent.observation_max_bytes or max_bytes)
    if agent.observation_template == BASH_OBSERVATION_TEMPLATE:  # the default, every turn: as Jinja renders it
        return f"<returncode>{result.exit_code}</returncode>\n<output>\n{body}\n</output>"
    out = {"returncode": result.exit_code, "output": body, "exception_info": ""}
    return render(agent.observation_template, output=out)

"""The harnesses ``rollout bench agents`` runs, unmodified, each against its own gateway session:
how to install it, configure it and start it on one task (the same set-up as the gateway's
harness tests), and what the scripted engine answers it (a tool call in the pool's Hermes
format for the harness's own shell tool, then the answer)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.benchmarks.npm_harness import HarnessUnavailable, npm_binary
from services.benchmarks.pip_harness import venv_binary

REPO = Path(__file__).resolve().parents[2]
MODEL = "policy"
THOUGHT = "<think>\nI should look first.\n</think>\n\n"


@dataclass(frozen=True)
class Episode:
    """One task for one harness: the session's base URL (the proxy), its id and key, a home and
    a work directory (the task's files are already there)."""

    proxy_url: str
    sid: str
    token: str
    home: Path
    work: Path
    task: str

    @property
    def openai_url(self) -> str:
        return f"{self.proxy_url}/e/{self.sid}/v1"

    @property
    def root_url(self) -> str:  # Anthropic and Gemini clients add their own version path
        return f"{self.proxy_url}/e/{self.sid}"


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def whole(path: str, content: str) -> str:
    """A reply in aider's "whole" edit format: the file's path, then its whole content fenced."""
    return f"I will write it down.\n\n{path}\n```\n{content}\n```"


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@dataclass(frozen=True)
class Harness:
    name: str
    route: str  # the gateway route (dialect) it speaks
    tool: str  # its shell tool
    shell: Callable[[str], dict[str, Any]]  # the tool's arguments for one shell command
    install: Callable[[], str]  # the executable; raises HarnessUnavailable
    launch: Callable[[str, Episode], Launch]
    prefix: str = ""  # before the tool call (Claude Code: a thinking block)
    submit: str = ""  # the second reply's tool command where the harness ends on a tool call
    answer_on_stdout: bool = True  # else: finished means exit 0 after all its scripted calls
    calls: int = 2  # scripted calls per episode
    edit: bool = False  # edits files instead of calling tools (aider): ANSWER.txt, a draft first
    lead: int = 0  # assistant turns of its own in its first request (Qwen Code): they shift the reply index

    def rules(self, tag: str, command: str, answer: str) -> list[tuple[str, list[str]]]:
        """The scripted engine's rules for one episode (``tag``: its task): the first rule whose
        ``match`` occurs in the prompt answers; the reply index is the prompt's assistant turns."""
        if self.edit:  # aider: its example turns shift the index, so the failing test picks the reply
            return [(aider_test(tag), [whole("ANSWER.txt", answer)]), (tag, [whole("ANSWER.txt", "draft")])]
        first = self.prefix + "I will look.\n" + hermes(self.tool, self.shell(command))
        second = hermes(self.tool, self.shell(self.submit)) if self.submit else answer
        return [(tag, [*(["(its own turn)"] * self.lead), first, second])]


def _codex(exe: str, ep: Episode) -> Launch:
    home = ep.home / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "rollout"\n[model_providers.rollout]\nname = "rollout"\n'
        f'base_url = "{ep.openai_url}"\nenv_key = "OPENAI_API_KEY"\nwire_api = "responses"\n'
    )
    argv = [exe, "exec", "--disable", "multi_agent", "-c", 'web_search="disabled"',
            "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check",
            "-C", str(ep.work), ep.task]  # fmt: skip
    return Launch(argv, {"CODEX_HOME": str(home), "HOME": str(ep.home), "OPENAI_API_KEY": ep.token}, ep.work)


def _claude(exe: str, ep: Episode) -> Launch:
    env = {"ANTHROPIC_BASE_URL": ep.root_url, "ANTHROPIC_API_KEY": ep.token, "HOME": str(ep.home),
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "IS_SANDBOX": "1"}  # fmt: skip  # IS_SANDBOX: --dangerously-skip-permissions as root
    return Launch([exe, "-p", ep.task, "--dangerously-skip-permissions", "--model", MODEL], env, ep.work)


GEMINI_SETTINGS = {  # the API-key auth, no usage statistics
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
}


def _gemini(exe: str, ep: Episode) -> Launch:
    (ep.home / ".gemini").mkdir(exist_ok=True)
    (ep.home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
    env = {"GOOGLE_GEMINI_BASE_URL": ep.root_url, "GEMINI_API_KEY": ep.token, "HOME": str(ep.home)}
    return Launch([exe, "-p", ep.task, "--yolo", "--skip-trust", "-m", MODEL], env, ep.work)


def _mini_exe() -> str:
    exe = Path(sys.executable).parent / "mini"
    if importlib.util.find_spec("minisweagent") is None or not exe.exists():
        raise HarnessUnavailable("mini-swe-agent is not installed (pip install mini-swe-agent)")
    return str(exe)


def _mini(exe: str, ep: Episode) -> Launch:
    argv = [exe, "-y", "--exit-immediately", "-l", "0", "-m", f"openai/{MODEL}", "-c", "mini.yaml",
            "-c", f"model.model_kwargs.api_base={ep.openai_url}", "-c", "model.cost_tracking=ignore_errors",
            "-o", str(ep.home / "mini.traj.json"), "-t", ep.task]  # fmt: skip
    env = {"OPENAI_API_KEY": ep.token, "HOME": str(ep.home), "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # fmt: skip
    return Launch(argv, env, ep.work)


SANDBOX_SHIM = '''"""A local stand-in for agent_client.sandbox: runs commands in the working directory."""
import subprocess
from dataclasses import dataclass


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


class SandboxClient:
    @classmethod
    def from_env(cls) -> "SandboxClient":
        return cls()

    def exec(self, command: str) -> ExecResult:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
        return ExecResult(done.returncode, done.stdout, done.stderr)
'''


def openai_sdk_example() -> str:
    """The openai SDK example agent of docs/agents.md, as written there."""
    text = (REPO / "docs" / "agents.md").read_text()
    found = re.search(r"### Worked example: the openai SDK\n+```python\n(.*?)```", text, re.S)
    if found is None:
        raise HarnessUnavailable("docs/agents.md has no openai SDK example")
    return found.group(1)


def _sdk_exe() -> str:
    if importlib.util.find_spec("openai") is None:
        raise HarnessUnavailable("the openai SDK is not installed")
    return sys.executable


def _sdk(exe: str, ep: Episode) -> Launch:
    """The docs' example with ``agent_client.sandbox`` replaced by a local stand-in that runs the
    commands in the work directory (the bench measures the gateway, not the sandbox broker)."""
    shim = ep.home / "shim" / "agent_client"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text("")
    (shim / "sandbox.py").write_text(SANDBOX_SHIM)
    (ep.home / "my_agent.py").write_text(openai_sdk_example())
    env = {"PYTHONPATH": str(shim.parent), "OPENAI_BASE_URL": ep.openai_url, "OPENAI_API_KEY": ep.token,
           "OPENAI_MODEL": MODEL, "ROLLOUT_TASK": ep.task, "HOME": str(ep.home)}  # fmt: skip
    return Launch([exe, str(ep.home / "my_agent.py")], env, ep.work)


def _qwen(exe: str, ep: Episode) -> Launch:
    """Qwen Code over chat completions; ``--bare``: no background memory-extraction call."""
    env = {"OPENAI_BASE_URL": ep.openai_url, "OPENAI_API_KEY": ep.token, "HOME": str(ep.home)}
    return Launch([exe, "-p", ep.task, "--yolo", "--bare", "--auth-type", "openai", "-m", MODEL], env, ep.work)


def _opencode(exe: str, ep: Episode) -> Launch:
    """opencode with an OpenAI-compatible provider at the session; it runs its tools in ``$PWD``.
    It asks for a title first (no tools): a segment of its own."""
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "rollout", "models": {MODEL: {"name": MODEL}},
                "options": {"baseURL": ep.openai_url, "apiKey": ep.token}}  # fmt: skip
    config = ep.home / "opencode.json"
    config.write_text(json.dumps({"provider": {"rollout": provider}}))
    env = {"OPENCODE_CONFIG": str(config), "PWD": str(ep.work), "HOME": str(ep.home)}
    return Launch([exe, "run", ep.task, "-m", f"rollout/{MODEL}"], env, ep.work)


AIDER = "0.86.2"


def aider_test(task: str) -> str:
    """aider's test command: fails while ANSWER.txt is the draft (the comment names the episode)."""
    return f"! grep -q draft ANSWER.txt  # {task}"


def _aider(exe: str, ep: Episode) -> Launch:
    """aider through litellm's OpenAI provider with the session as ``api_base``; the "whole" edit
    format, no git, no repository map, no update check or analytics (no other network here). Its
    test command fails on the draft, so aider sends the failure back: a second, merged call."""
    argv = [exe, "--model", f"openai/{MODEL}", "--openai-api-base", ep.openai_url, "--openai-api-key", ep.token,
            "--edit-format", "whole", "--yes-always", "--no-git", "--map-tokens", "0", "--no-check-update",
            "--no-analytics", "--no-show-model-warnings", "--no-pretty", "--no-fancy-input", "--no-detect-urls",
            "--no-show-release-notes", "--auto-test", "--test-cmd", aider_test(ep.task),
            "--message", ep.task]  # fmt: skip
    env = {"HOME": str(ep.home), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "AIDER_ANALYTICS": "false"}
    return Launch(argv, env, ep.work)


def _npm(package: str, version: str, binary: str) -> Callable[[], str]:
    return lambda: str(npm_binary(package, version, binary))


def _command(c: str) -> dict[str, Any]:
    return {"command": c}


HARNESSES: dict[str, Harness] = {
    h.name: h
    for h in (
        Harness("openai-sdk", "chat", "bash", _command, _sdk_exe, _sdk, answer_on_stdout=False),
        Harness(
            "mini-swe-agent",
            "chat",
            "bash",
            _command,
            _mini_exe,
            _mini,
            submit="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
            answer_on_stdout=False,
        ),
        Harness(
            "codex",
            "responses",
            "exec_command",
            lambda c: {"cmd": c},
            _npm("@openai/codex", "0.169.0", "codex"),
            _codex,
        ),
        Harness(
            "claude-code",
            "messages",
            "Bash",
            lambda c: {"command": c, "description": "Run it"},
            _npm("@anthropic-ai/claude-code", "2.1.328", "claude"),
            _claude,
            prefix=THOUGHT,
        ),
        Harness(
            "gemini-cli",
            "gemini",
            "run_shell_command",
            _command,
            _npm("@google/gemini-cli", "0.61.0", "gemini"),
            _gemini,
        ),
        Harness(
            "qwen-code",
            "chat",
            "run_shell_command",
            _command,
            _npm("@qwen-code/qwen-code", "0.15.10", "qwen"),
            _qwen,
            lead=1,
        ),
        Harness(
            "opencode",
            "chat",
            "bash",
            lambda c: {"command": c, "description": "Run it"},
            _npm("opencode-ai", "1.18.33", "opencode"),
            _opencode,
            answer_on_stdout=False,  # its output carries terminal escapes
            calls=3,
        ),
        Harness(
            "aider",
            "chat",
            "",
            _command,
            lambda: str(venv_binary("aider-chat", AIDER, "aider")),
            _aider,
            answer_on_stdout=False,
            edit=True,
        ),
    )
}

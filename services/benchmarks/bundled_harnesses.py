"""How each harness runs inside the task sandbox from its agent bundle (``/opt/agents/NAME``), as a
``command`` agent: ``{"kind": "command", "bundle": NAME, "argv": ["/bin/sh", "-c", SCRIPT], "env":
QUIET}``. The script reads only what the worker gives every sandbox agent (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``OPENAI_MODEL``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``,
``ANTHROPIC_MODEL`` at the forwarded ``http://127.0.0.1:PORT/e/{session}``, and ``ROLLOUT_TASK``)
and writes the harness's own configuration (Codex's ``config.toml``, Gemini CLI's settings) where
the sandbox lets it. ``rollout bench agents``, the in-sandbox harness tests and docs/agents.md's
table use these; the pinned versions are what they were measured with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.sandbox_broker.bundles import install

PINNED = {"openai-sdk": "3.63.0", "mini-swe-agent": "2.4.6", "codex": "0.169.0", "claude-code": "2.1.328",
          "gemini-cli": "0.61.0", "aider": "0.86.2", "qwen-code": "0.15.10", "opencode": "1.18.33"}  # fmt: skip
# no telemetry, update checks or start-up banners (the sandbox has no network but its gateway)
QUIET = {
    "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
    "AIDER_ANALYTICS": "false",
}  # fmt: skip

MINI = ('exec mini -y --exit-immediately -l 0 -m "openai/$OPENAI_MODEL" -c mini.yaml '
        '-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -c model.cost_tracking=ignore_errors '
        '-o /tmp/mini.traj.json -t "$ROLLOUT_TASK"')  # fmt: skip
CLAUDE = 'exec claude -p "$ROLLOUT_TASK" --dangerously-skip-permissions --model "$ANTHROPIC_MODEL"'
# Codex: a Responses provider at the session (config.toml in a CODEX_HOME of its own); its
# sub-agent namespace tool and hosted web search off (a chat template renders neither); its own
# sandbox off (it runs in the task sandbox)
CODEX = """mkdir -p /tmp/codex && cat > /tmp/codex/config.toml <<EOF
model = "$OPENAI_MODEL"
model_provider = "rollout"
[model_providers.rollout]
name = "rollout"
base_url = "$OPENAI_BASE_URL"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
EOF
CODEX_HOME=/tmp/codex exec codex exec --disable multi_agent -c 'web_search="disabled"' \\
  --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check "$ROLLOUT_TASK"
"""
# Gemini CLI: the Gemini API at the session root, API-key auth, no usage statistics
GEMINI = """mkdir -p "$HOME/.gemini" && cat > "$HOME/.gemini/settings.json" <<EOF
{"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": false}}
EOF
GOOGLE_GEMINI_BASE_URL="$ANTHROPIC_BASE_URL" GEMINI_API_KEY="$OPENAI_API_KEY" \\
  exec gemini -p "$ROLLOUT_TASK" --yolo --skip-trust -m "$OPENAI_MODEL"
"""
# aider: litellm's OpenAI provider at the session, the "whole" edit format, no git, no repository
# map, nothing else on the network; more flags after the script (``sh -c SCRIPT sh ARGS``)
AIDER = """exec aider --model "openai/$OPENAI_MODEL" --openai-api-base "$OPENAI_BASE_URL" \\
  --openai-api-key "$OPENAI_API_KEY" --edit-format whole --yes-always --no-git --map-tokens 0 \\
  --no-check-update --no-analytics --no-show-model-warnings --no-pretty --no-fancy-input --no-detect-urls \\
  --no-show-release-notes --message "$ROLLOUT_TASK" "$@"
"""
# Qwen Code: its OpenAI auth at the session; --bare: no background memory call
QWEN = 'exec qwen -p "$ROLLOUT_TASK" --yolo --bare --auth-type openai -m "$OPENAI_MODEL"'
# opencode: an OpenAI-compatible provider at the session (a config file of its own); it runs its
# tools in $PWD
OPENCODE = """cat > /tmp/opencode.json <<EOF
{"provider": {"rollout": {"npm": "@ai-sdk/openai-compatible", "name": "rollout",
  "options": {"baseURL": "$OPENAI_BASE_URL", "apiKey": "$OPENAI_API_KEY"},
  "models": {"$OPENAI_MODEL": {"name": "$OPENAI_MODEL"}}}}}
EOF
OPENCODE_CONFIG=/tmp/opencode.json PWD="$(pwd)" exec opencode run "$ROLLOUT_TASK" -m "rollout/$OPENAI_MODEL"
"""
# the openai SDK example of docs/agents.md as its own program: its ``agent_client.sandbox`` stand-in
# runs the commands where it is, in the task sandbox
SDK_SHIM = """import subprocess
from dataclasses import dataclass


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


class SandboxClient:
    @classmethod
    def from_env(cls) -> "SandboxClient":
        return cls()

    def exec(self, command: str) -> ExecResult:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
        return ExecResult(done.returncode, done.stdout, done.stderr)
"""


def sdk_script(example: str) -> str:
    """The script that writes ``example`` (the docs' agent) and its stand-in under /tmp and runs it."""
    return ("mkdir -p /tmp/agent/agent_client && : > /tmp/agent/agent_client/__init__.py\n"
            f"cat > /tmp/agent/agent_client/sandbox.py <<'EOF'\n{SDK_SHIM}EOF\n"
            f"cat > /tmp/agent/my_agent.py <<'EOF'\n{example}EOF\n"
            "PYTHONPATH=/tmp/agent exec python /tmp/agent/my_agent.py\n")  # fmt: skip


@dataclass(frozen=True)
class Inside:
    bundle: str
    script: str  # run as ``/bin/sh -c SCRIPT`` with the bundle's bin/ first on PATH


SCRIPTS = {
    "mini-swe-agent": MINI,
    "codex": CODEX,
    "claude-code": CLAUDE,
    "gemini-cli": GEMINI,
    "aider": AIDER,
    "qwen-code": QWEN,
    "opencode": OPENCODE,
}


def inside(name: str, sdk_example: str = "") -> Inside:
    """How harness ``name`` starts in the sandbox (the openai SDK one needs the example's text)."""
    return Inside(name, sdk_script(sdk_example) if name == "openai-sdk" else SCRIPTS[name])


def ensure_bundles(root: Path, names: list[str]) -> dict[str, str]:
    """The pinned bundles of ``names`` under ``root``, built where missing (once per machine: a process
    that finds one being built waits for it); the ones that could not be built, with the reason."""
    failed: dict[str, str] = {}
    for name in names:
        try:
            install(name, root, PINNED[name], missing_only=True)
        except Exception as exc:  # a registry out of reach, a failed build: that harness cannot run
            failed[name] = f"building the {name} {PINNED[name]} bundle failed: {str(exc)[-500:]}"
    return failed

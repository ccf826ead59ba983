"""The agent spec: which agent acts in an episode (``Task.agent`` or ``RolloutRequest.agent``).

- ``bash``: the built-in loop (one bash block per reply, token in / token out), every template
  configurable. Templates are Jinja2 with mini-swe-agent's variable names, and a mini-swe-agent
  YAML config (``{"agent": {...}, "model": {...}, "environment": {...}}``) is accepted as is.
- ``tools``: the built-in tool-calling loop (bash, a file viewer/editor, submit) through the
  episode's gateway session; tool calls are parsed from the generated tokens by the pool's parser.
- ``command``: the user's own agent program, started per episode inside the task sandbox (or,
  where the operator allows it, on the worker's host) with OpenAI/Anthropic environment variables
  pointing at the episode's gateway session.
- ``env``: an environment of an outside package (SkyRL-Gym, OpenEnv) stepped by the worker between
  LLM turns through the gateway session: its observations become the next messages, its step rewards
  are the reward, its ``done`` ends the episode (``services/protocol/environments.py``).

Written by the user, read by the API (validation), carried in the work item, read by the worker.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

BASH_SYSTEM_TEMPLATE = """You are a helpful assistant that can interact with a computer shell to solve tasks.

Your response must contain exactly ONE bash code block with ONE command (or commands connected
with && or ||). Include a THOUGHT section before your command explaining your reasoning.

<format_example>
THOUGHT: Your reasoning and analysis here

```bash
your_command_here
```
</format_example>

Each command runs in a fresh subshell in the task's working directory; its exit code and output
are shown to you. When you are done, submit with exactly this command and nothing else:

```bash
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
```"""

BASH_INSTANCE_TEMPLATE = "Please solve this task:\n\n{{task}}"

BASH_FORMAT_ERROR_TEMPLATE = (
    "Please always provide EXACTLY ONE action in triple backticks, found {{actions|length}} actions.\n"
    """If you want to end the task, please issue the following command: `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
without any other command. Otherwise, format your response exactly as follows:

THOUGHT: Here are some thoughts about why you want to perform the action.

```bash
<action>
```"""
)

BASH_OBSERVATION_TEMPLATE = "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}\n</output>"
BASH_ACTION_REGEX = r"```bash\s*\n(.*?)\n?```"

# mini-swe-agent config keys that map onto ours (section -> key); every other key is ignored
_MSWEA_KEYS = {
    "agent": ("system_template", "instance_template", "step_limit"),
    "model": ("observation_template", "format_error_template", "action_regex"),
}

TOOLS_SYSTEM_TEMPLATE = (
    "You are a helpful assistant that solves tasks in a Linux sandbox with the tools you are given. "
    "Call one tool at a time. When the task is done, call the submit tool."
)

BuiltinTool = Literal["bash", "file", "submit"]
BUILTIN_TOOLS: tuple[BuiltinTool, ...] = ("bash", "file", "submit")
ToolParser = Literal["hermes", "qwen3_coder"]


class _Agent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BashAgent(_Agent):
    """Today's loop with every template configurable (mini-swe-agent's field names and variables:
    ``task``; ``output.returncode`` / ``output.output`` / ``output.exception_info``; ``actions``)."""

    kind: Literal["bash"] = "bash"
    system_template: str = BASH_SYSTEM_TEMPLATE
    instance_template: str = BASH_INSTANCE_TEMPLATE
    format_error_template: str = BASH_FORMAT_ERROR_TEMPLATE
    observation_template: str = BASH_OBSERVATION_TEMPLATE
    action_regex: str = BASH_ACTION_REGEX  # one match = one action; any other count is a format error
    submit_marker: str = SUBMIT_MARKER  # ``echo MARKER``, or output whose first line is MARKER, submits
    observation_max_bytes: int | None = Field(None, ge=256)  # None: ``AgentLimits.observation_max_bytes``
    step_limit: int | None = Field(None, ge=0)  # mini-swe-agent's; tightens ``AgentLimits.max_turns`` (0: none)

    @model_validator(mode="before")
    @classmethod
    def _from_mini_swe_agent(cls, data: Any) -> Any:
        """Flatten a mini-swe-agent YAML config (``agent:``/``model:``/``environment:``) into our fields."""
        if not isinstance(data, dict) or not ({"agent", "model", "environment", "run"} & data.keys()):
            return data
        flat: dict[str, Any] = {k: v for k, v in data.items() if k in ("kind", "submit_marker")}
        for section, names in _MSWEA_KEYS.items():
            part = data.get(section) or {}
            if not isinstance(part, dict):
                raise ValueError(f"{section} must be a mapping")
            flat.update({name: part[name] for name in names if part.get(name) is not None})
        return flat


class ToolsAgent(_Agent):
    """The built-in tool-calling loop, run through the episode's gateway session."""

    kind: Literal["tools"] = "tools"
    system_template: str = TOOLS_SYSTEM_TEMPLATE
    instance_template: str = BASH_INSTANCE_TEMPLATE
    tools: list[BuiltinTool] = Field(default_factory=lambda: list(BUILTIN_TOOLS), min_length=1)
    parser: ToolParser | None = None  # None: the pool's parser (gateway setting), else hermes
    max_format_errors: int = Field(3, ge=1)  # malformed calls in a row before the episode stops


class CommandAgent(_Agent):
    """Bring your own agent: a program started per episode against the episode's gateway session."""

    kind: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1)  # the program and its arguments (no shell)
    # "sandbox": inside the task sandbox, through the broker, as the sandbox's user; "paired": inside a
    # second sandbox of its own (``agent_template``), driving the task sandbox with ``agent_client`` through
    # its gateway forwarder and a lease token of that one lease; "host": beside the platform on the
    # worker's host, confined (trusted single-tenant setups only: refused unless the operator allows it,
    # ``ROLLOUT_API_ALLOW_HOST_AGENTS`` / ``ROLLOUT_WORKER_ALLOW_HOST_AGENTS``); "beside" is read as "host"
    where: Literal["sandbox", "paired", "host"] = "sandbox"
    # "paired": the agent sandbox's template, a registered one (None: "default", the host's /usr python)
    agent_template: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")] | None = None
    env: dict[str, str] = Field(default_factory=dict)  # added to the program's environment
    model: str = "policy"  # the model name the program is told to use (OPENAI_MODEL / ROLLOUT_MODEL)
    output_max_bytes: int = Field(10_000, ge=256)  # tail of stdout+stderr kept on the trajectory
    # an agent bundle installed on the broker's host (``rollout agents install NAME``), read-only at
    # /opt/agents/NAME in the sandbox: its bin/ goes first on PATH, its name/version/digest on the trajectory
    bundle: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")] | None = None

    @model_validator(mode="after")
    def _bundles_run_in_the_sandbox(self) -> CommandAgent:
        if self.bundle is not None and self.where == "host":
            raise ValueError('an agent bundle is mounted in a sandbox: it needs where "sandbox" or "paired"')
        if self.agent_template is not None and self.where != "paired":
            raise ValueError('agent_template names the agent sandbox of where "paired"')
        return self

    @field_validator("where", mode="before")
    @classmethod
    def _beside_is_host(cls, value: Any) -> Any:
        return "host" if value == "beside" else value  # the name of the host mode before "sandbox" existed


EnvSource = Literal[
    "skyrl-gym", "openenv", "verifiers", "atropos"
]  # the packages an ``env`` agent can step (services/protocol/environments.py)


class EnvAgent(_Agent):
    """An outside package's environment, stepped by the worker: the LLM's reply is the action, the
    environment's observations are the next messages, and its step rewards (summed) are the reward."""

    kind: Literal["env"] = "env"
    source: EnvSource
    env: str = Field(min_length=1, max_length=2_000)  # the environment: SkyRL-Gym's id ("gsm8k"), OpenEnv's server URL
    config: dict[str, Any] = Field(default_factory=dict)  # the environment's own config (``env_config``)
    extras: dict[str, Any] = Field(default_factory=dict)  # per-task data (SkyRL-Gym's ``reward_spec``, ...)
    # the source's initial chat (OpenAI messages); empty: one user message, the task's prompt
    messages: list[dict[str, str]] = Field(default_factory=list, max_length=1_000)


AGENTS_DIR = "/opt/agents"  # agent bundles inside a sandbox: AGENTS_DIR/NAME/{bundle.json,bin/...}
BUNDLE_MANIFEST = "bundle.json"


class AgentBundle(BaseModel):
    """``bundle.json`` of an agent bundle: written by ``rollout agents install``, read by the worker."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    source: str  # "pypi:mini-swe-agent", "npm:@anthropic-ai/claude-code"
    version: str
    digest: str  # "sha256:<hex>" over every file of the bundle but this manifest
    commands: list[str] = Field(default_factory=list)  # in bin/


AgentSpec = Annotated[BashAgent | ToolsAgent | CommandAgent | EnvAgent, Field(discriminator="kind")]

"""The mini-swe-agent style protocol: the system prompt, parsing one bash block per reply, and
turning command output into the next user message. Plain functions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.protocol.sandboxes import ExecResult

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

SYSTEM_PROMPT = f"""You are a helpful assistant that can interact with a computer shell to solve tasks.

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
{SUBMIT_COMMAND}
```"""

FORMAT_ERROR = """Please always provide EXACTLY ONE action in triple backticks, found {count} actions.
If you want to end the task, please issue the following command: `{submit}`
without any other command. Otherwise, format your response exactly as follows:

THOUGHT: Here are some thoughts about why you want to perform the action.

```bash
<action>
```"""

_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n?```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Action:
    command: str | None  # the one bash command, or None when the reply was malformed
    blocks: int  # how many bash blocks the reply had

    @property
    def submits(self) -> bool:
        return self.command is not None and self.command.strip() in (SUBMIT_COMMAND, "submit")


def parse_action(reply: str) -> Action:
    blocks = _BASH_BLOCK.findall(reply)
    if len(blocks) != 1:
        return Action(command=None, blocks=len(blocks))
    return Action(command=blocks[0].strip(), blocks=1)


def format_error(action: Action) -> str:
    return FORMAT_ERROR.format(count=action.blocks, submit=SUBMIT_COMMAND)


def truncate_middle(text: str, max_bytes: int) -> str:
    """Keep the head and tail of ``text`` within about ``max_bytes`` UTF-8 bytes."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    keep = max(0, max_bytes - 100) // 2
    head = raw[:keep].decode(errors="ignore")
    tail = raw[len(raw) - keep :].decode(errors="ignore")
    return f"{head}\n[... {len(raw) - 2 * keep} bytes elided ...]\n{tail}"


def observation(result: ExecResult, max_bytes: int) -> str:
    output = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr)
    body = truncate_middle(output, max_bytes)
    return f"<returncode>{result.exit_code}</returncode>\n<output>\n{body}\n</output>"


def task_message(prompt: str) -> str:
    return f"Please solve this task:\n\n{prompt}"

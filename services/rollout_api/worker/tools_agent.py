"""The built-in ``tools`` agent: an OpenAI-style tool-calling loop through the episode's gateway
session (so its prompts are rendered with the chat template's own tool format and its calls are
parsed from the generated tokens by the pool's parser), with tools executed in the sandbox:

- ``bash``: a command in the task's working directory;
- ``file``: ``view`` (numbered lines), ``create`` (write ``file_text``), ``str_replace``
  (``old_str`` must occur exactly once; replaced by ``new_str``);
- ``submit``: the agent is done.

A reply without a usable tool call (markup that did not parse, an unknown tool, bad arguments)
is fed back to the model as an error message and counted; ``max_format_errors`` of them in a
row end the episode (completed: the reward decides), never a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from services.protocol import Cap, ErrorCode, InfraStage
from services.protocol.agents import ToolsAgent
from services.protocol.sandboxes import ExecRequest
from services.protocol.trajectory import AgentRun
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError
from services.rollout_api.worker.conversation import render, truncate_middle

_STR = {"type": "string"}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": {"name": "bash", "description": "Run a bash command in the task's working directory; returns its "
             "exit code and output.", "parameters": {"type": "object", "properties": {"command": _STR},
                                                     "required": ["command"]}},
    "file": {"name": "file", "description": "View or edit a file. command=view shows it with line numbers; "
             "command=create writes file_text; command=str_replace replaces old_str (which must occur exactly "
             "once) with new_str.",
             "parameters": {"type": "object", "properties": {
                 "command": {"type": "string", "enum": ["view", "create", "str_replace"]}, "path": _STR,
                 "file_text": _STR, "old_str": _STR, "new_str": _STR}, "required": ["command", "path"]}},
    "submit": {"name": "submit", "description": "Finish the task.", "parameters": {"type": "object", "properties": {}}},
}  # fmt: skip


class Submitted(Exception):
    pass


@dataclass
class ToolsRun:
    spec: ToolsAgent
    http: aiohttp.ClientSession
    base_url: str  # the session's OpenAI base URL
    token: str
    broker: BrokerClient
    lease_id: str
    workdir: str
    env: dict[str, str]
    command_timeout_s: float
    observation_max_bytes: int
    max_turns: int

    async def run(self, task: str, record: AgentRun) -> Cap | None:
        tools = [{"type": "function", "function": TOOL_SCHEMAS[name]} for name in self.spec.tools]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": render(self.spec.system_template)},
            {"role": "user", "content": render(self.spec.instance_template, task=task)},
        ]
        in_a_row = 0
        for _ in range(self.max_turns):
            doc = await self._complete(messages, tools)
            if doc is None:  # a cap refused the call; the gateway marked the session truncated
                return None
            choice = doc["choices"][0]
            message = choice["message"]
            messages.append(_echo(message))
            record.last_output = str(message.get("content") or "")[-2000:]
            if choice["finish_reason"] == "length":
                return Cap.TURN_TOKENS
            try:
                results = await self._act(message, (doc.get("metadata") or {}).get("tool_parse_errors") or [])
            except Submitted:
                return None
            except ValueError as exc:  # a malformed or missing call: tell the model, count it
                record.format_errors += 1
                in_a_row += 1
                if in_a_row >= self.spec.max_format_errors:
                    return None
                messages.append({"role": "user", "content": f"Error: {exc}. Reply with exactly one tool call."})
                continue
            in_a_row = 0
            messages += results
        return Cap.TURNS

    async def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any] | None:
        return await gateway_chat(self.http, self.base_url, self.token, messages, tools)

    async def _act(self, message: dict[str, Any], parse_errors: list[str]) -> list[dict[str, Any]]:
        calls = message.get("tool_calls") or []
        if not calls:
            why = "; ".join(parse_errors) if parse_errors else "the reply has no tool call"
            raise ValueError(f"no valid tool call ({why})")
        results = []
        for call in calls:
            name = call["function"]["name"]
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                raise ValueError(f"the arguments of {name} are not JSON") from None
            output = await self._tool(name, arguments)
            results.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        return results

    async def _tool(self, name: str, args: dict[str, Any]) -> str:
        if name not in self.spec.tools:
            raise ValueError(f"unknown tool {name!r}; the tools are {', '.join(self.spec.tools)}")
        if name == "submit":
            raise Submitted
        if any("\x00" in v for v in args.values() if isinstance(v, str)):
            raise ValueError(f"the arguments of {name} contain a NUL byte, which no shell or path can hold")
        if name == "bash":
            if not isinstance(args.get("command"), str):
                raise ValueError("bash needs a string command")
            return await self._bash(args["command"])
        return await self._file(args)

    async def _bash(self, command: str) -> str:
        request = ExecRequest(shell=command, timeout_s=self.command_timeout_s, env=self.env, cwd=self.workdir)
        result = await self.broker.exec(self.lease_id, request)
        output = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr)
        return f"exit code {result.exit_code}\n{truncate_middle(output, self.observation_max_bytes)}"

    async def _file(self, args: dict[str, Any]) -> str:
        command, path = args.get("command"), args.get("path")
        if not isinstance(path, str) or command not in ("view", "create", "str_replace"):
            raise ValueError("file needs command (view|create|str_replace) and path")
        full = path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"
        if command == "create":
            await self.broker.write_file(self.lease_id, full, str(args.get("file_text", "")))
            return f"created {path}"
        raw = await self.broker.read_file(self.lease_id, full)
        if raw is None:
            return f"error: {path} does not exist"
        text = raw.decode(errors="replace")
        if command == "view":
            numbered = "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.splitlines(), 1))
            return truncate_middle(numbered, self.observation_max_bytes)
        old, new = str(args.get("old_str", "")), str(args.get("new_str", ""))
        count = text.count(old) if old else 0
        if count != 1:
            return f"error: old_str occurs {count} times in {path}; it must occur exactly once"
        await self.broker.write_file(self.lease_id, full, text.replace(old, new, 1))
        return f"edited {path}"


def _echo(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as sent back on the next call."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


async def gateway_chat(
    http: aiohttp.ClientSession,
    base_url: str,
    token: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> dict[str, Any] | None:
    """One chat completion through the episode's gateway session (``tools`` sent unless None): the
    reply, or None where the episode must stop (context full, session closed); anything else is an
    infra error of the LLM stage."""
    body: dict[str, Any] = {"model": "policy", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with http.post(f"{base_url}/chat/completions", json=body, headers=headers) as response:
            doc = await response.json(content_type=None)
            status = response.status
    except aiohttp.ClientError as exc:
        raise InfraError(InfraStage.LLM, ErrorCode.TRANSPORT_ERROR, f"gateway unreachable: {exc!r}") from exc
    if status == 200:
        return dict(doc)
    code = (doc.get("error") or {}).get("code") if isinstance(doc, dict) else None
    if code in (ErrorCode.CONTEXT_LENGTH_EXCEEDED, ErrorCode.FORBIDDEN):
        return None
    raise InfraError(InfraStage.LLM, ErrorCode.ENGINE_ERROR, f"gateway answered {status}: {str(doc)[:300]}")

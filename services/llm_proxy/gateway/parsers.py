"""Tool calls parsed from generated text, one parser per pool (SGLang's names).

- ``hermes`` (= ``qwen25``): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  (Hermes, Qwen2.5, Qwen3, QwQ);
- ``qwen3_coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>\\n</function>``
  ``\\n</tool_call>`` (Qwen3-Coder, Qwen3.5/3.6); values are JSON when they parse, else text.

As in SGLang, the content is the text before the first call. Markup that does not parse (bad
JSON, a missing name, an unterminated tag) is counted as an error and the raw text is kept as
content, so the agent sees what the model wrote and nothing is dropped silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

PARSERS = ("hermes", "qwen25", "qwen3_coder")


@dataclass
class ParsedReply:
    content: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (name, arguments)
    errors: list[str] = field(default_factory=list)  # why markup did not parse


def parse_tool_calls(text: str, parser: str) -> ParsedReply:
    if OPEN not in text:
        return ParsedReply(content=text)
    one = _qwen3_coder_call if parser == "qwen3_coder" else _hermes_call
    blocks = _BLOCK.findall(text)
    reply = ParsedReply(content=text[: text.index(OPEN)].rstrip())
    if text.count(OPEN) != len(blocks):
        reply.errors.append("a <tool_call> tag is not closed")
    for block in blocks:
        try:
            reply.calls.append(one(block))
        except ValueError as exc:
            reply.errors.append(str(exc))
    if reply.errors:
        reply.content = text  # keep everything the model wrote
    return reply


def _hermes_call(block: str) -> tuple[str, dict[str, Any]]:
    try:
        doc = json.loads(block)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ValueError('tool call needs {"name": ..., "arguments": {...}}')
    arguments = doc.get("arguments", doc.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError("tool call arguments are not a JSON object") from None
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments are not a JSON object")
    return doc["name"], arguments


def _qwen3_coder_call(block: str) -> tuple[str, dict[str, Any]]:
    match = _FUNCTION.match(block)
    if match is None:
        raise ValueError("tool call needs <function=NAME>...</function>")
    arguments: dict[str, Any] = {}
    for key, raw in _PARAMETER.findall(match.group(2)):
        arguments[key.strip()] = _value(raw)
    return match.group(1).strip(), arguments


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def render_call(name: str, arguments: dict[str, Any], parser: str) -> str:
    """How a model answering in ``parser``'s format writes one call (tests, scripted engines)."""
    if parser == "qwen3_coder":
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

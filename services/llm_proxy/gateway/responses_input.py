"""OpenAI Responses requests (``POST /e/{s}/v1/responses``), validated and turned into the chat
template's messages and tools.

``input`` is a string or a list of items: messages (``input_text`` / ``output_text`` parts),
``function_call`` (joined to the assistant message before it, as the gateway answered it),
``function_call_output`` (a ``role: tool`` message), ``reasoning`` (put back at the head of the
next assistant message, verbatim when it carries the gateway's ``encrypted_content``).
``instructions`` and the leading system/developer messages become one system message (chat
templates take one, first). Only function tools render in a chat template: any other tool type,
input item or content part is a 400 naming it, never dropped.

Fields that cannot change the tokens (``store``, ``include``, ``prompt_cache_key``,
``client_metadata``, ``metadata``, ``user``, ``safety_identifier``, ``service_tier``,
``truncation``, ``parallel_tool_calls``, ``reasoning``: the pool's model reasons as it does) are
accepted; ``temperature`` / ``top_p`` are logged as on the other routes (the episode's sampling
applies). What would change the generation and cannot be honoured (``tool_choice`` other than
``auto`` / ``none``, a non-text ``text.format``, ``background``) is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.llm_proxy.gateway.reasoning import unseal
from services.llm_proxy.gateway.requests import TemplateMessage, arguments_dict, template_call
from services.protocol import ErrorCode, PlatformError


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # "yes" is not a bool, "1" not a number

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    text: dict[str, Any] | None = None
    background: bool | None = None
    metadata: dict[str, Any] | None = None


def _refuse(field: str, message: str) -> PlatformError:
    return PlatformError(ErrorCode.BAD_REQUEST, message, field=field)


def check_generation_fields(req: ResponsesRequest) -> bool:
    """Refuse what cannot be honoured; True when tools are offered (``tool_choice`` is not ``none``)."""
    if req.background:
        raise _refuse("background", "background responses are not served: send the call and wait for it")
    fmt = (req.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        raise _refuse("text.format", f"text.format {fmt.get('type')!r} is not served (no constrained decoding)")
    choice = req.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        reason = "a forced tool call needs constrained decoding"
        raise _refuse("tool_choice", f"tool_choice must be 'auto' or 'none' ({reason})")
    return choice != "none"


def response_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools in the shape chat templates take; another type is a 400 naming it."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise _refuse(f"tools.{i}.type", f"tools.{i}: tool type {kind!r} is not served (function tools only)")
        if not isinstance(tool.get("name"), str):
            raise _refuse(f"tools.{i}.name", f"tools.{i}.name is required")
        function = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    return out


def _part_text(content: Any, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(field, f"{field} must be a string or a list of parts")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            raise _refuse(f"{field}.{k}.type", f"{field}.{k}: content part {kind!r} is not served (text only)")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


class _Builder:
    def __init__(self) -> None:
        self.out: list[TemplateMessage] = []
        self.thinking = ""  # reasoning waiting for the next assistant message

    def assistant(self) -> TemplateMessage:
        """The assistant message a function call joins: the last one when nothing followed it."""
        last = self.out[-1] if self.out else None
        if last is not None and last["role"] == "assistant" and not self.thinking:
            return last
        message: TemplateMessage = {"role": "assistant", "content": self.thinking}
        self.thinking = ""
        self.out.append(message)
        return message

    def message(self, role: str, text: str) -> None:
        if role == "assistant":
            text, self.thinking = self.thinking + text, ""
        self.out.append({"role": role, "content": text})


def input_messages(req: ResponsesRequest, history: list[TemplateMessage] | None = None) -> list[TemplateMessage]:
    """The conversation: ``history`` (a previous response's messages and reply, from the session log;
    its system message replaced by ``instructions`` when they are given), then ``input``."""
    items: list[dict[str, Any]] = (
        [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    )
    b = _Builder()
    b.out = [dict(m) for m in history or []]
    system = [req.instructions] if req.instructions else []
    for i, item in enumerate(items):
        field = f"input.{i}"
        if not isinstance(item, dict):
            raise _refuse(field, f"{field} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                roles = "user, assistant, system, developer"
                raise _refuse(f"{field}.role", f"{field}.role {role!r} is not one of {roles}")
            text = _part_text(item.get("content"), f"{field}.content")
            if role in ("system", "developer"):
                if not b.out:  # still leading: one system message
                    system.append(text)
                    continue
                role = "system"
            b.message(role, text)
        elif kind == "function_call":
            name = item.get("name")
            if not isinstance(name, str):
                raise _refuse(f"{field}.name", f"{field}.name is required")
            call = template_call(name, arguments_dict(item.get("arguments"), f"{field}.arguments"))
            b.assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            b.out.append({"role": "tool", "content": _part_text(item.get("output"), f"{field}.output")})
        elif kind == "reasoning":
            text = _part_text(item.get("content") or item.get("summary"), f"{field}.summary")
            b.thinking += unseal(item.get("encrypted_content"), text)
        else:
            raise _refuse(f"{field}.type", f"{field}: input item type {kind!r} is not served")
    if history and history[0]["role"] == "system":  # the previous response's; new instructions replace it
        kept = b.out.pop(0)["content"]
        system = system or [kept]
    if system:
        b.out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return b.out

"""Request bodies of the gateway's routes, validated so that a wrongly typed parameter is a 400
naming the field, and normalised into the chat template's message form.

Unknown fields are accepted and ignored (SDKs send many). Template messages are dicts with
``role`` and string ``content``; assistant tool calls carry ``arguments`` as a dict (templates
need one), tool results are ``role: tool``.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.llm_proxy.gateway.reasoning import unseal
from services.protocol import ErrorCode, PlatformError

TemplateMessage = dict[str, Any]
T = TypeVar("T", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # "yes" is not a bool, "1" not a number

    model: str | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0)  # logged; the platform's sampling applies
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # "yes" is not a bool, "1" not a number

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = Field(1, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream_options: dict[str, Any] | None = None


class CompletionRequest(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]
    n: int = Field(1, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    echo: bool = False


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # "yes" is not a bool, "1" not a number

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Body):
    """``/v1/messages/count_tokens``: what a message's prompt is made of."""

    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # enabled / adaptive: reasoning comes as thinking blocks
    output_config: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    top_k: int | None = None

    @property
    def thinks(self) -> bool:
        return (self.thinking or {}).get("type") in ("enabled", "adaptive")


def parse(model: type[T], body: dict[str, Any]) -> T:
    """Validate ``body``; the first error becomes a 400 naming its field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise PlatformError(ErrorCode.BAD_REQUEST, f"{field}: {first['msg']}", field=field) from None


def refuse_n(n: int) -> None:
    if n != 1:
        raise PlatformError(ErrorCode.BAD_REQUEST, "n > 1 is not served: send n separate calls", field="n")


def text_of(content: Any) -> str:
    """String content, or the text parts of a content array joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")


def arguments_dict(arguments: Any, field: str) -> dict[str, Any]:
    """Tool-call arguments as a dict (the wire carries a JSON string)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = orjson.loads(arguments or "{}")
    except (orjson.JSONDecodeError, TypeError):
        raise PlatformError(ErrorCode.BAD_REQUEST, f"{field} is not a JSON object", field=field) from None
    if not isinstance(value, dict):
        raise PlatformError(ErrorCode.BAD_REQUEST, f"{field} is not a JSON object", field=field)
    return value


def template_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def chat_messages(request: ChatRequest) -> list[TemplateMessage]:
    out: list[TemplateMessage] = []
    for i, m in enumerate(request.messages):
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        message: TemplateMessage = {"role": role, "content": text_of(m.content)}
        if m.tool_calls:
            message["tool_calls"] = [
                _openai_call(c, f"messages.{i}.tool_calls.{k}") for k, c in enumerate(m.tool_calls)
            ]
        out.append(message)
    return out


def _openai_call(call: dict[str, Any], field: str) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise PlatformError(ErrorCode.BAD_REQUEST, f"{field}.function.name is required", field=field)
    return template_call(function["name"], arguments_dict(function.get("arguments"), f"{field}.function.arguments"))


def openai_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise PlatformError(ErrorCode.BAD_REQUEST, f"tools.{i}.function.name is required", field=f"tools.{i}")
    return tools


def anthropic_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic tools in the OpenAI shape the chat templates expect."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool.get("name"), str):
            raise PlatformError(ErrorCode.BAD_REQUEST, f"tools.{i}.name is required", field=f"tools.{i}.name")
        function = {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    return out


def anthropic_messages(request: CountTokensRequest) -> list[TemplateMessage]:
    out: list[TemplateMessage] = []
    system = text_of(request.system)
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(request.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        out.extend(_anthropic_blocks(m.role, m.content, f"messages.{i}.content"))
    return out


def _anthropic_blocks(role: str, blocks: list[dict[str, Any]], field: str) -> list[TemplateMessage]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[TemplateMessage] = []
    for k, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "thinking":  # the model's reasoning, verbatim when the signature is the gateway's
            texts.append(unseal(block.get("signature"), str(block.get("thinking", ""))))
        elif kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                template_call(str(block.get("name")), arguments_dict(block.get("input"), f"{field}.{k}.input"))
            )
        elif kind == "tool_result":
            results.append({"role": "tool", "content": text_of(block.get("content"))})
        elif kind not in ("redacted_thinking", "image"):
            raise PlatformError(ErrorCode.BAD_REQUEST, f"{field}.{k}.type {kind!r} is not supported", field=field)
    out: list[TemplateMessage] = list(results)
    if texts or calls or not results:
        message: TemplateMessage = {"role": role, "content": "".join(texts)}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def completion_prompt(request: CompletionRequest) -> str | list[int]:
    prompt = request.prompt
    if isinstance(prompt, str):
        return prompt
    if prompt and all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt]  # type: ignore[arg-type]
    if len(prompt) == 1:
        only = prompt[0]
        return only if isinstance(only, str) else [int(t) for t in only]  # type: ignore[union-attr]
    raise PlatformError(ErrorCode.BAD_REQUEST, "one prompt per call (a batch is n calls)", field="prompt")

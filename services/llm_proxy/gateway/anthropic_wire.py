"""Anthropic Messages wire format of gateway answers: the message, its SSE event sequence
(``message_start``, ``ping``, per block start/delta/stop, ``message_delta``, ``message_stop``;
every event named, as the SDKs require; a thinking block streams ``thinking_delta`` then
``signature_delta``) and Anthropic-shaped errors."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from services.llm_proxy.gateway import reasoning
from services.llm_proxy.gateway.turns import TurnResult
from services.protocol import ErrorCode, PlatformError

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_doc(exc: PlatformError) -> dict[str, Any]:
    """Anthropic's ``{"type": "error", "error": {type, message}}`` plus our ``ErrorBody`` fields."""
    detail = exc.body().model_dump(mode="json")["error"]
    message = exc.message
    if exc.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED and "prompt is too long" not in message:
        message = f"prompt is too long: {message}"
    kind = _ERROR_TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {**detail, "type": kind, "message": message}}


def stop_reason(result: TurnResult, stops: list[str] | None) -> tuple[str, str | None]:
    if result.truncated:
        return "max_tokens", None
    if result.parsed.calls:
        return "tool_use", None
    for stop in stops or []:
        if result.text.endswith(stop):
            return "stop_sequence", stop
    return "end_turn", None


def blocks(result: TurnResult, thinks: bool = False) -> list[dict[str, Any]]:
    """Content blocks; with ``thinks`` (the request's ``thinking`` is enabled or adaptive) the
    model's reasoning is a ``thinking`` block whose ``signature`` carries it verbatim (``reasoning.py``)."""
    out: list[dict[str, Any]] = []
    text = result.parsed.content
    if thinks:
        parts = reasoning.split(text)
        if parts.raw:
            out.append({"type": "thinking", "thinking": parts.text, "signature": reasoning.seal(parts.raw)})
        text = parts.rest
    if text or not result.parsed.calls:
        out.append({"type": "text", "text": text})
    for k, (name, args) in enumerate(result.parsed.calls):
        out.append({"type": "tool_use", "id": f"toolu_{result.index}_{k}", "name": name, "input": args})
    return out


def _usage(result: TurnResult, output: int) -> dict[str, Any]:
    return {
        "input_tokens": len(result.plan.prompt_ids),
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.answer.cached_tokens,
    }


def message(result: TurnResult, model: str, stops: list[str] | None, thinks: bool = False) -> dict[str, Any]:
    reason, sequence = stop_reason(result, stops)
    return {
        "id": f"msg_{result.view.session.session}_{result.index}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks(result, thinks),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(result, len(result.answer.output_ids)),
        "metadata": {
            "weight_version": result.answer.weight_version,
            "engine_id": result.answer.engine_id,
            "call_index": result.index,
        },
    }


def events(
    result: TurnResult, model: str, stops: list[str] | None, thinks: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    whole = message(result, model, stops, thinks)
    start = {**whole, "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(result, 0)}
    out: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(whole["content"]):
        opened: dict[str, Any]
        deltas: list[dict[str, Any]]
        if block["type"] == "text":
            opened, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        elif block["type"] == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": opened}))
        for delta in deltas:
            out.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    final = {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
    out.append(
        (
            "message_delta",
            {"type": "message_delta", "delta": final, "usage": {"output_tokens": len(result.answer.output_ids)}},
        )
    )
    out.append(("message_stop", {"type": "message_stop"}))
    return out


async def send_events(request: web.Request, items: list[tuple[str, dict[str, Any]]]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(
        b"".join(f"event: {name}\n".encode() + b"data: " + orjson.dumps(doc) + b"\n\n" for name, doc in items)
    )
    await response.write_eof()
    return response

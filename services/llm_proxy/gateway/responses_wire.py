"""OpenAI Responses wire format of gateway answers: the ``response`` object and its SSE events, in
the order the openai SDK's stream state accumulates them (and Codex CLI waits for:
``response.completed`` ends every stream that generated).

Output items: a ``reasoning`` item when the reply opens with the model's reasoning
(``reasoning.py``; the verbatim text rides in ``encrypted_content``), a ``message`` with one
``output_text`` part when there is text (or no call), then one ``function_call`` per parsed call.
Events: ``response.created``, ``response.in_progress``, per item ``response.output_item.added``,
its content (``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
``response.content_part.done``; or ``response.function_call_arguments.delta`` / ``.done``),
``response.output_item.done``, then ``response.completed`` (``response.incomplete`` when the
token cap cut the reply). The response also carries the recorded ids (``prompt_token_ids``,
``output_token_ids``) and provenance under ``rollout``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson
from aiohttp import web

from services.llm_proxy.gateway import openai_wire, reasoning
from services.llm_proxy.gateway.responses_input import ResponsesRequest
from services.llm_proxy.gateway.turns import TurnResult
from services.runtime.chat import ChatTemplate

Event = dict[str, Any]


def response_id(sid: str, index: int) -> str:
    return f"resp_{sid}_{index}"


def output_items(result: TurnResult) -> list[dict[str, Any]]:
    sid, n = result.view.session.session, result.index
    parts = reasoning.split(result.parsed.content)
    items: list[dict[str, Any]] = []
    if parts.raw:
        items.append(
            {
                "id": f"rs_{sid}_{n}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": parts.text}],
                "content": [{"type": "reasoning_text", "text": parts.text}],
                "encrypted_content": reasoning.seal(parts.raw),
                "status": "completed",
            }
        )
    if parts.rest or not result.parsed.calls:
        text = {"type": "output_text", "text": parts.rest, "annotations": [], "logprobs": []}
        items.append(
            {"id": f"msg_{sid}_{n}", "type": "message", "role": "assistant", "status": "completed", "content": [text]}
        )
    for k, (name, args) in enumerate(result.parsed.calls):
        items.append(
            {
                "id": f"fc_{sid}_{n}_{k}",
                "type": "function_call",
                "call_id": f"call_{n}_{k}",
                "name": name,
                "arguments": json.dumps(args, ensure_ascii=False),
                "status": "completed",
            }
        )
    return items


def response(result: TurnResult, req: ResponsesRequest, model: str, chat: ChatTemplate) -> dict[str, Any]:
    """The whole response (``reasoning_tokens``: the tokenizer's count of the reasoning text)."""
    prompt, output = len(result.plan.prompt_ids), len(result.answer.output_ids)
    thought = reasoning.split(result.parsed.content).raw
    return {
        **_shell(result, req, model),
        "status": "incomplete" if result.truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if result.truncated else None,
        "output": output_items(result),
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": result.answer.cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": len(chat.encode(thought)) if thought else 0},
            "total_tokens": prompt + output,
        },
        "prompt_token_ids": result.plan.prompt_ids,
        "output_token_ids": result.answer.output_ids,
        "rollout": openai_wire.metadata(result),
    }


def _shell(result: TurnResult, req: ResponsesRequest, model: str) -> dict[str, Any]:
    return {
        "id": response_id(result.view.session.session, result.index),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "error": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning or {"effort": None, "summary": None},
        "store": True if req.store is None else req.store,
        "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
    }


def events(result: TurnResult, req: ResponsesRequest, model: str, chat: ChatTemplate) -> list[Event]:
    whole = response(result, req, model, chat)
    opening = {**_shell(result, req, model), "status": "in_progress", "incomplete_details": None, "output": []}
    out: list[Event] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(whole["output"]):
        out.extend(_item_events(index, item))
    final = "response.incomplete" if result.truncated else "response.completed"
    out.append({"type": final, "response": whole})
    for seq, event in enumerate(out):
        event["sequence_number"] = seq
    return out


def _item_events(index: int, item: dict[str, Any]) -> list[Event]:
    at = {"output_index": index}
    if item["type"] == "message":
        part = item["content"][0]
        where = {**at, "item_id": item["id"], "content_index": 0}
        added = {**item, "status": "in_progress", "content": []}
        body: list[Event] = [
            {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
            {"type": "response.output_text.delta", **where, "delta": part["text"], "logprobs": []},
            {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []},
            {"type": "response.content_part.done", **where, "part": part},
        ]
    elif item["type"] == "function_call":
        where = {**at, "item_id": item["id"]}
        added = {**item, "status": "in_progress", "arguments": ""}
        body = [
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": item["name"],
                "arguments": item["arguments"],
            },
        ]
    else:  # reasoning: whole at once
        added, body = {**item, "status": "in_progress"}, []
    return [
        {"type": "response.output_item.added", **at, "item": added},
        *body,
        {"type": "response.output_item.done", **at, "item": item},
    ]


async def send_events(request: web.Request, items: list[Event]) -> web.StreamResponse:
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    await stream.write(
        b"".join(f"event: {e['type']}\n".encode() + b"data: " + orjson.dumps(e) + b"\n\n" for e in items)
    )
    await stream.write_eof()
    return stream

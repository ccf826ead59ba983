"""OpenAI wire format of gateway answers: chat completions and text completions, whole or as SSE
chunks in the order the openai SDK's stream helpers accumulate, and OpenAI-shaped errors.

Streams are replayed from the finished generation (token ids and logprobs need the whole
``meta_info``): role chunk, content, each tool call (id and name, then its arguments), finish,
usage when ``stream_options.include_usage``, ``[DONE]``. Answers also carry the recorded ids
(vLLM's ``prompt_token_ids`` / ``token_ids``) and provenance under ``metadata``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson
from aiohttp import web

from services.llm_proxy.gateway.turns import TurnResult
from services.protocol import PlatformError
from services.runtime.chat import ChatTemplate


def error_doc(exc: PlatformError) -> dict[str, Any]:
    """``ErrorBody`` plus the keys the OpenAI SDK reads (``type``, ``param``)."""
    detail = exc.body().model_dump(mode="json")["error"]
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return {"error": {**detail, "type": kind, "param": exc.field}}


def finish_reason(result: TurnResult) -> str:
    if result.truncated:
        return "length"
    return "tool_calls" if result.parsed.calls else "stop"


def usage(result: TurnResult) -> dict[str, Any]:
    prompt, completion = len(result.plan.prompt_ids), len(result.answer.output_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": result.answer.cached_tokens},
    }


def metadata(result: TurnResult) -> dict[str, Any]:
    a = result.answer
    return {
        "weight_version": a.weight_version,
        "engine_id": a.engine_id,
        "call_index": result.index,
        "segment": result.plan.segment,
        "merged": result.plan.merged,
        "tool_parse_errors": result.parsed.errors,
    }


def tool_calls(result: TurnResult) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{result.index}_{k}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        for k, (name, args) in enumerate(result.parsed.calls)
    ]


def _token(chat: ChatTemplate, token_id: int, logprob: float) -> dict[str, Any]:
    text = chat.decode([token_id], skip_special=False)
    return {"token": text, "bytes": list(text.encode()), "logprob": logprob}


def chat_logprobs(result: TurnResult, chat: ChatTemplate, top: int) -> dict[str, Any]:
    """Per generated token (the end-of-turn token excluded): token, bytes, logprob, top alternatives."""
    ids, lps, alts = result.answer.output_ids, result.answer.logprobs, result.answer.top_logprobs
    n = len(ids) - 1 if ids[-1:] == [chat.eos_id] else len(ids)
    content = []
    for i in range(n):
        entry = _token(chat, ids[i], lps[i])
        options = alts[i][:top] if i < len(alts) else []
        entry["top_logprobs"] = [_token(chat, t, lp) for t, lp in options]
        content.append(entry)
    return {"content": content}


def _head(result: TurnResult, model: str, kind: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{result.view.session.session}-{result.index}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


def chat_completion(result: TurnResult, model: str, chat: ChatTemplate, logprobs: int | None) -> dict[str, Any]:
    calls = tool_calls(result)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.parsed.content if not calls else (result.parsed.content or None),
    }
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason(result),
        "logprobs": None if logprobs is None else chat_logprobs(result, chat, logprobs),
        "token_ids": result.answer.output_ids,
    }
    return {
        **_head(result, model, "chat.completion"),
        "choices": [choice],
        "usage": usage(result),
        "prompt_token_ids": result.plan.prompt_ids,
        "metadata": metadata(result),
    }


def chat_chunks(
    result: TurnResult, model: str, chat: ChatTemplate, logprobs: int | None, include_usage: bool
) -> list[dict[str, Any]]:
    head = _head(result, model, "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}

    out = [chunk({"role": "assistant", "content": ""}, logprobs=None)]
    lp = None if logprobs is None else chat_logprobs(result, chat, logprobs)
    if result.parsed.content or lp is not None:
        out.append(chunk({"content": result.parsed.content}, logprobs=lp))
    for k, call in enumerate(tool_calls(result)):
        fn = call["function"]
        start = {"index": k, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [start]}))
        out.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]}))
    out.append(chunk({}, finish_reason(result), token_ids=result.answer.output_ids))
    out[-1]["metadata"] = metadata(result)
    if include_usage:
        out.append({**head, "choices": [], "usage": usage(result)})
    return out


def completion(result: TurnResult, model: str, chat: ChatTemplate, logprobs: int | None) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": result.text,
        "finish_reason": "length" if result.truncated else "stop",
        "logprobs": None,
        "token_ids": result.answer.output_ids,
    }
    if logprobs is not None:
        entries = chat_logprobs(result, chat, logprobs)["content"]
        offsets, at = [], 0
        for e in entries:
            offsets.append(at)
            at += len(e["token"])
        choice["logprobs"] = {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets,
        }
    head = {**_head(result, model, "text_completion"), "id": f"cmpl-{result.view.session.session}-{result.index}"}
    return {
        **head,
        "choices": [choice],
        "usage": usage(result),
        "prompt_token_ids": result.plan.prompt_ids,
        "metadata": metadata(result),
    }


async def send_sse(request: web.Request, frames: list[dict[str, Any]]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(b"".join(b"data: " + orjson.dumps(f) + b"\n\n" for f in frames) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response

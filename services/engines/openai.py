"""SGLang's OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from services.engines.batching import Generation
from services.engines.engine import Engine, EngineRequestError, GenerateParams
from services.engines.native import ENGINE
from services.engines.openai_logprobs import LogprobRequest, chat_logprobs, completion_logprobs
from services.engines.responses import json_response, openai_error, read_json, stream_sse, wait_done
from services.engines.tokenization import render_chat


def _finish(engine: Engine, gen: Generation) -> str | None:
    reason = engine.finish_reason(gen)
    return None if reason is None else str(reason["type"])


def _usage(engine: Engine, gen: Generation) -> dict[str, Any]:
    completion = len(engine.output_ids(gen))
    return {
        "prompt_tokens": gen.prompt_len,
        "completion_tokens": completion,
        "total_tokens": gen.prompt_len + completion,
        "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
    }


def _text(engine: Engine, gen: Generation, start: int = 0) -> str:
    assert engine.codec is not None
    return engine.codec.decode_visible(engine.output_ids(gen)[start:])


class _Call:
    """One OpenAI call: its prompt, parameters and the generation serving it."""

    def __init__(self, engine: Engine, body: dict[str, Any], chat: bool) -> None:
        self.engine, self.body, self.chat = engine, body, chat
        if engine.codec is None:
            raise EngineRequestError("The OpenAI routes need a tokenizer: start the engine with --model-path.")
        if chat:
            self.prompt_ids = engine.codec.encode(render_chat(body.get("messages") or []))
        else:
            prompt = body.get("prompt")
            self.prompt_ids = prompt if isinstance(prompt, list) else engine.codec.encode(str(prompt or ""))
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        self.params = GenerateParams(
            max_new_tokens=None if max_new is None else int(max_new),
            ignore_eos=bool(body.get("ignore_eos", False)),
            stream=bool(body.get("stream", False)),
        )
        self.created = int(time.time())
        self.model = str(body.get("model") or engine.settings.served_model_name)
        self.logprobs = LogprobRequest.of(body, chat=chat)

    def choice_logprobs(self, gen: Generation, start: int = 0) -> dict[str, Any] | None:
        """The tokens' logprobs from ``start`` on, when the call asked for them."""
        if self.logprobs is None:
            return None
        shape = chat_logprobs if self.chat else completion_logprobs
        return shape(self.engine, gen, self.prompt_ids, self.logprobs, start)

    def head(self, gen: Generation, kind: str) -> dict[str, Any]:
        return {"id": gen.rid, "object": kind, "created": self.created, "model": self.model}

    def complete(self, gen: Generation) -> dict[str, Any]:
        e = self.engine
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": _text(e, gen)}}
            doc = self.head(gen, "chat.completion")
        else:
            choice = {"index": 0, "text": _text(e, gen)}
            doc = self.head(gen, "text_completion")
        choice["finish_reason"] = _finish(e, gen)
        choice["logprobs"] = self.choice_logprobs(gen)
        return {**doc, "choices": [choice], "usage": _usage(e, gen), "metadata": {"weight_version": e.weight_version}}

    def frames(self, gen: Generation, sent: int, final: bool) -> list[dict[str, Any]]:
        e = self.engine
        piece = _text(e, gen, sent)
        if self.chat:
            delta: dict[str, Any] = {"content": piece} if sent else {"role": "assistant", "content": piece}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            doc = self.head(gen, "chat.completion.chunk")
        else:
            choice = {"index": 0, "text": piece}
            doc = self.head(gen, "text_completion")
        choice["finish_reason"] = _finish(e, gen) if final else None
        if self.logprobs is not None:
            choice["logprobs"] = self.choice_logprobs(gen, sent)
        frame = {**doc, "choices": [choice]}
        if final:
            frame["usage"] = _usage(e, gen)
            frame["metadata"] = {"weight_version": e.weight_version}
        return [frame]


async def _serve(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE]
    try:
        body = await read_json(request)
        call = _Call(engine, body, chat)
        gen = await engine.generate(call.prompt_ids, call.params, body.get("rid"))
    except (EngineRequestError, ValueError, TypeError) as exc:
        return openai_error(str(exc))
    if call.params.stream:
        resp = await stream_sse(request, engine, gen, lambda sent, final: call.frames(gen, sent, final))
    else:
        await wait_done(engine, gen)
        resp = json_response(call.complete(gen))
    engine.record_finished(gen, call.prompt_ids)
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    card = {
        "id": engine.settings.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": engine.model_path,
        "max_model_len": engine.settings.context_length,
    }
    return json_response({"object": "list", "data": [card]})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)

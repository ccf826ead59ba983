"""The agent gateway's routes, per session (``/e/{session}/...``):

- ``POST /e/{s}/v1/chat/completions`` (tools, streaming and not), ``POST /e/{s}/v1/completions``,
  ``GET /e/{s}/v1/models`` (with the context window), ``GET /e/{s}/v1/models/{model}``: OpenAI
  (base URL ``{proxy}/e/{s}/v1``);
- ``POST /e/{s}/v1/responses`` (function tools, reasoning items, streaming and not): OpenAI Responses;
- ``POST /e/{s}/v1/messages`` (tools, thinking, streaming and not; ``?beta=true`` and the
  ``anthropic-beta`` headers as Claude Code sends them), ``POST /e/{s}/v1/messages/count_tokens``
  (the pool's tokenizer): Anthropic (base URL ``{proxy}/e/{s}``);
- ``POST /e/{s}/v1beta/models/{model}:generateContent`` / ``:streamGenerateContent`` /
  ``:countTokens``: Gemini (base URL ``{proxy}/e/{s}``; the key also as ``x-goog-api-key`` or ``?key=``).

Authenticated by the session's token as ``Authorization: Bearer``, ``x-api-key`` or ``x-goog-api-key``. Errors are
the platform's ``ErrorBody`` with the keys each SDK reads added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from redis.asyncio import Redis

from services.llm_proxy.calls import Forwarder
from services.llm_proxy.fleet import FleetView
from services.llm_proxy.gateway import anthropic_wire, gemini_wire, openai_wire, responses_wire
from services.llm_proxy.gateway.fields import audit, tools_offered
from services.llm_proxy.gateway.metrics import GatewayMetrics
from services.llm_proxy.gateway.pools import PoolConfigs
from services.llm_proxy.gateway.requests import (
    ChatRequest,
    CompletionRequest,
    CountTokensRequest,
    MessagesRequest,
    anthropic_messages,
    anthropic_tools,
    chat_messages,
    completion_prompt,
    openai_tools,
    parse,
    refuse_n,
)
from services.llm_proxy.gateway.responses_input import (
    ResponsesRequest,
    check_generation_fields,
    input_messages,
    response_tools,
)
from services.llm_proxy.gateway.sessions import SessionStore, request_token
from services.llm_proxy.gateway.turns import TurnRequest, Turns
from services.llm_proxy.responses import json_response, read_json
from services.llm_proxy.settings import ProxySettings
from services.protocol import ErrorCode, PlatformError
from services.protocol.gateway import GatewaySession

Handler = Callable[[web.Request, GatewaySession, dict[str, Any]], Awaitable[web.StreamResponse]]


class Gateway:
    def __init__(
        self, settings: ProxySettings, forwarder: Forwarder, redis: Redis, view: FleetView, metrics: GatewayMetrics
    ) -> None:
        self.store = SessionStore(redis)
        self.pools = PoolConfigs(settings, view)
        self.metrics = metrics
        self.turns = Turns(forwarder, self.store, self.pools, metrics)

    def close(self) -> None:
        self.store.close()

    def add_routes(self, app: web.Application) -> None:
        openai, anthropic = openai_wire.error_doc, anthropic_wire.error_doc
        app.router.add_post("/e/{session}/v1/chat/completions", self._serve(self.chat, openai))
        app.router.add_post("/e/{session}/v1/completions", self._serve(self.completions, openai))
        app.router.add_post("/e/{session}/v1/responses", self._serve(self.responses, openai))
        app.router.add_post("/e/{session}/v1/messages", self._serve(self.messages, anthropic))
        app.router.add_post("/e/{session}/v1/messages/count_tokens", self._serve(self.count_tokens, anthropic))
        app.router.add_get("/e/{session}/v1/models", self._serve(self.models, openai))
        app.router.add_get("/e/{session}/v1/models/{model}", self._serve(self.model, openai))
        app.router.add_post("/e/{session}/v1beta/models/{target}", self._serve(self.gemini, gemini_wire.error_doc))

    def _serve(
        self, handler: Handler, error_doc: Callable[[PlatformError], dict[str, Any]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            try:
                token = request_token(request.headers) or request.query.get("key")
                session = await self.store.authorize(request.match_info["session"], token)
                body = await read_json(request) if request.method == "POST" else {}
                return await handler(request, session, body)
            except PlatformError as exc:
                self.metrics.refused.labels(exc.code.value).inc()
                return json_response(error_doc(exc), exc.status)

        return serve

    def _card(self, session: GatewaySession) -> dict[str, Any]:
        """The session's model, OpenAI- and Anthropic-shaped, with the context a harness should size
        itself to: the engines' context cap or the episode's trajectory cap, the smaller."""
        window = min(self.turns.forwarder.guard.context_cap, session.max_trajectory_tokens)
        return {
            "id": session.model,
            "object": "model",
            "type": "model",
            "display_name": session.model,
            "created": 0,
            "created_at": "1970-01-01T00:00:00Z",
            "owned_by": "rollout",
            "context_window": window,
            "context_length": window,
            "max_model_len": window,
            "max_output_tokens": session.max_tokens_per_turn,
        }

    async def models(self, request: web.Request, session: GatewaySession, body: dict[str, Any]) -> web.Response:
        card = self._card(session)
        doc = {"object": "list", "data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]}
        return json_response(doc)

    async def model(self, request: web.Request, session: GatewaySession, body: dict[str, Any]) -> web.Response:
        if request.match_info["model"] != session.model:
            raise PlatformError(ErrorCode.NOT_FOUND, f"model {request.match_info['model']!r}: this session serves "
                                f"{session.model!r}")  # fmt: skip
        return json_response(self._card(session))

    async def chat(self, request: web.Request, session: GatewaySession, body: dict[str, Any]) -> web.StreamResponse:
        req = parse(ChatRequest, body)
        refuse_n(req.n)
        unused = audit("chat", body)
        top = _top_logprobs(req.logprobs, req.top_logprobs)
        tools = openai_tools(req.tools)
        turn = TurnRequest(
            route="chat",
            messages=chat_messages(req),
            tools=tools if tools_offered("chat", body) else None,
            prompt=None,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            top_logprobs=top or 0,
            stop=_stops(req.stop),
            unused=unused,
        )
        chat, model = self.pools.template(session.pool), req.model or session.model
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            chunks = await self.turns.run(
                request, session, turn, lambda result: openai_wire.chat_chunks(result, model, chat, top, usage)
            )
            return await openai_wire.send_sse(request, chunks)
        return await self.turns.run(
            request, session, turn, lambda result: json_response(openai_wire.chat_completion(result, model, chat, top))
        )

    async def completions(
        self, request: web.Request, session: GatewaySession, body: dict[str, Any]
    ) -> web.StreamResponse:
        req = parse(CompletionRequest, body)
        refuse_n(req.n)
        if req.echo:
            raise PlatformError(ErrorCode.BAD_REQUEST, "echo is not supported", field="echo")
        turn = TurnRequest(
            route="completions",
            messages=None,
            tools=None,
            prompt=completion_prompt(req),
            max_tokens=req.max_tokens,
            top_logprobs=req.logprobs or 0,
            stop=_stops(req.stop),
            unused=audit("completions", body),
        )
        chat, model = self.pools.template(session.pool), req.model or session.model
        doc = await self.turns.run(
            request, session, turn, lambda result: openai_wire.completion(result, model, chat, req.logprobs)
        )
        if req.stream:
            return await openai_wire.send_sse(request, [doc])
        return json_response(doc)

    async def messages(self, request: web.Request, session: GatewaySession, body: dict[str, Any]) -> web.StreamResponse:
        req = parse(MessagesRequest, body)
        # the query (Claude Code's ``?beta=true``) selects nothing here: listed as ``?NAME``
        unused = (*audit("messages", body), *(f"?{name}" for name in sorted(request.query)))
        stops = _stops(req.stop_sequences)
        tools = anthropic_tools(req.tools)
        turn = TurnRequest(
            route="messages",
            messages=anthropic_messages(req),
            tools=tools if tools_offered("messages", body) else None,
            prompt=None,
            max_tokens=req.max_tokens,
            stop=stops,
            unused=unused,
        )
        model, thinks = req.model or session.model, req.thinks
        if req.stream:
            items = await self.turns.run(
                request, session, turn, lambda result: anthropic_wire.events(result, model, stops, thinks)
            )
            return await anthropic_wire.send_events(request, items)
        return await self.turns.run(
            request, session, turn, lambda result: json_response(anthropic_wire.message(result, model, stops, thinks))
        )

    async def count_tokens(self, request: web.Request, session: GatewaySession, body: dict[str, Any]) -> web.Response:
        """The prompt ids a message call with these messages would render to, from scratch (a call
        that merges sends the same count: merged ids are the rendered ids unless it is a mismatch)."""
        req = parse(CountTokensRequest, body)
        chat = self.pools.template(session.pool)
        ids = chat.encode(chat.render(anthropic_messages(req), True, anthropic_tools(req.tools)))
        return json_response({"input_tokens": len(ids)})

    async def responses(
        self, request: web.Request, session: GatewaySession, body: dict[str, Any]
    ) -> web.StreamResponse:
        req = parse(ResponsesRequest, body)
        offered = check_generation_fields(req)
        unused = audit("responses", body)
        tools = response_tools(req.tools)
        history = await self._previous(session, req.previous_response_id) if req.previous_response_id else None
        turn = TurnRequest(
            route="responses",
            messages=input_messages(req, history),
            tools=tools if offered else None,
            prompt=None,
            max_tokens=req.max_output_tokens,
            unused=unused,
        )
        chat, model = self.pools.template(session.pool), req.model or session.model
        if req.stream:
            items = await self.turns.run(
                request, session, turn, lambda result: responses_wire.events(result, req, model, chat)
            )
            return await responses_wire.send_events(request, items)
        return await self.turns.run(
            request, session, turn, lambda result: json_response(responses_wire.response(result, req, model, chat))
        )

    async def _previous(self, session: GatewaySession, previous: str) -> list[dict[str, Any]]:
        """The conversation of the session's latest response (its messages and reply), from the log;
        only the latest one can be continued (older ones are not kept apart)."""
        view = await self.store.read(session)
        latest = responses_wire.response_id(session.session, view.recorded - 1) if view.recorded else None
        if view.last is None or view.last.reply is None or previous != latest:
            raise PlatformError(
                ErrorCode.BAD_REQUEST,
                f"previous_response_id {previous!r} is not this session's latest chat response "
                f"({latest or 'none yet'}): send the whole conversation in input",
                field="previous_response_id",
            )
        return [*view.last.messages, view.last.reply]

    async def gemini(self, request: web.Request, session: GatewaySession, body: dict[str, Any]) -> web.StreamResponse:
        name, _, action = request.match_info["target"].rpartition(":")
        if action not in ("generateContent", "streamGenerateContent", "countTokens"):
            raise PlatformError(ErrorCode.NOT_FOUND, f"no Gemini method {action!r} (generateContent, "
                                "streamGenerateContent, countTokens)")  # fmt: skip
        if action == "countTokens" and isinstance(body.get("generateContentRequest"), dict):
            body = body["generateContentRequest"]
        req = gemini_wire.GeminiRequest(body)
        tools, messages = gemini_wire.tools(body), gemini_wire.messages(body, req)
        if action == "countTokens":
            chat = self.pools.template(session.pool)
            return json_response({"totalTokens": len(chat.encode(chat.render(messages, True, tools)))})
        turn = TurnRequest(
            route="gemini",
            messages=messages,
            tools=tools if req.offered else None,
            prompt=None,
            max_tokens=req.max_tokens,
            stop=req.stop,
            unused=req.unused,
        )
        model, thoughts = name or session.model, req.thoughts
        if action == "streamGenerateContent":
            docs = await self.turns.run(request, session, turn, lambda r: gemini_wire.chunks(r, model, thoughts))
            return await gemini_wire.send_stream(request, docs)
        return await self.turns.run(
            request, session, turn, lambda r: json_response(gemini_wire.response(r, model, thoughts))
        )


def _top_logprobs(logprobs: bool, top: int | None) -> int | None:
    """None: no logprobs in the answer; else how many alternatives per token."""
    if top and not logprobs:
        raise PlatformError(ErrorCode.BAD_REQUEST, "top_logprobs requires logprobs: true", field="top_logprobs")
    return (top or 0) if logprobs else None


def _stops(stop: str | list[str] | None) -> list[str] | None:
    if stop is None:
        return None
    return [stop] if isinstance(stop, str) else list(stop)

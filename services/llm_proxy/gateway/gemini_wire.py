"""Gemini API on the gateway (``POST /e/{s}/v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` with ``?alt=sse`` or as a JSON array, ``:countTokens``), for Gemini CLI
(``GOOGLE_GEMINI_BASE_URL={proxy}/e/{s}``, the key as ``x-goog-api-key`` or ``?key=``).

Requests: ``contents`` (``user`` / ``model`` turns of ``text``, ``functionCall`` and
``functionResponse`` parts), ``systemInstruction``, ``tools`` (``functionDeclarations`` only:
another tool kind is a 400 naming it), ``toolConfig`` (``AUTO``, or ``NONE``: tools not offered;
``ANY`` forces a call and is refused), ``generationConfig`` (``maxOutputTokens`` and
``stopSequences`` honoured; a JSON ``responseMimeType`` or schema and ``candidateCount`` > 1
refused; the sampling parameters unused, the episode's sampling applies). A ``functionResponse``
is a ``tool`` message with its ``response`` as JSON (or its ``output`` / ``result`` / ``content``
when that is the only key and a string).

Answers: one candidate whose ``model`` content holds, with ``thinkingConfig.includeThoughts``, a
``thought`` part for the model's reasoning (its ``thoughtSignature`` carries it verbatim, as
``reasoning.py``; without it the reasoning stays in the text), the text, then one ``functionCall``
per parsed call. Streams send one chunk per part; the last carries ``finishReason`` and
``usageMetadata``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from services.llm_proxy.gateway import reasoning
from services.llm_proxy.gateway.requests import TemplateMessage, template_call
from services.llm_proxy.gateway.turns import TurnResult
from services.protocol import ErrorCode, PlatformError

HONOURED = frozenset(["contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config"])
_CONFIG = ("generationConfig", "generation_config")
GENERATION_HONOURED = frozenset(["maxOutputTokens", "max_output_tokens", "stopSequences", "stop_sequences"])
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}  # fmt: skip


def error_doc(exc: PlatformError) -> dict[str, Any]:
    """Google's ``{"error": {code, message, status}}`` plus our ``ErrorBody`` fields."""
    detail = exc.body().model_dump(mode="json")["error"]
    status = _STATUS.get(exc.status, "INTERNAL")
    return {"error": {**detail, "code": exc.status, "message": exc.message, "status": status, "reason": exc.code.value}}


def _refuse(field: str, message: str) -> PlatformError:
    return PlatformError(ErrorCode.BAD_REQUEST, message, field=field)


def _get(doc: dict[str, Any], camel: str, snake: str) -> Any:
    return doc.get(camel, doc.get(snake))


class GeminiRequest:
    """A validated ``generateContent`` body."""

    def __init__(self, body: dict[str, Any]) -> None:
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise _refuse("contents", "contents: a non-empty list of contents is required")
        self.contents: list[Any] = contents
        config = _get(body, "generationConfig", "generation_config") or {}
        if not isinstance(config, dict):
            raise _refuse("generationConfig", "generationConfig must be an object")
        self.config = config
        self.thoughts = bool((_get(config, "thinkingConfig", "thinking_config") or {}).get("includeThoughts"))
        self.offered = self._tool_mode(_get(body, "toolConfig", "tool_config") or {})
        self.unused = self._audit(body, config)

    @property
    def max_tokens(self) -> int | None:
        value = _get(self.config, "maxOutputTokens", "max_output_tokens")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise _refuse(
                "generationConfig.maxOutputTokens", "generationConfig.maxOutputTokens must be an integer >= 1"
            )
        return value

    @property
    def stop(self) -> list[str] | None:
        value = _get(self.config, "stopSequences", "stop_sequences")
        if value is not None and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
            raise _refuse("generationConfig.stopSequences", "generationConfig.stopSequences must be a list of strings")
        return value

    @staticmethod
    def _tool_mode(config: dict[str, Any]) -> bool:
        mode = str((_get(config, "functionCallingConfig", "function_calling_config") or {}).get("mode", "AUTO"))
        if mode.upper() not in ("AUTO", "NONE", "MODE_UNSPECIFIED"):
            raise _refuse("toolConfig.functionCallingConfig.mode", f"mode {mode!r} forces a call: not served")
        return mode.upper() != "NONE"

    @staticmethod
    def _audit(body: dict[str, Any], config: dict[str, Any]) -> tuple[str, ...]:
        mime = _get(config, "responseMimeType", "response_mime_type")
        if mime not in (None, "text/plain"):
            raise _refuse("generationConfig.responseMimeType", f"responseMimeType {mime!r} needs constrained decoding")
        for name in ("responseSchema", "responseJsonSchema", "response_schema", "response_json_schema"):
            if config.get(name) is not None:
                raise _refuse(f"generationConfig.{name}", f"{name} needs constrained decoding")
        if _get(config, "candidateCount", "candidate_count") not in (None, 1):
            raise _refuse("generationConfig.candidateCount", "candidateCount > 1 is not served: send separate calls")
        unused = [
            name for name in body if name not in HONOURED and name not in ("generationConfig", "generation_config")
        ]
        unused += [f"generationConfig.{name}" for name in config if name not in GENERATION_HONOURED]
        return tuple(sorted(unused))


def tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    out = []
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict):
            raise _refuse(f"tools.{i}", f"tools.{i} must be an object")
        for kind in tool:
            if kind not in ("functionDeclarations", "function_declarations"):
                raise _refuse(
                    f"tools.{i}.{kind}", f"tools.{i}: tool {kind!r} is not served (functionDeclarations only)"
                )
        for k, fn in enumerate(_get(tool, "functionDeclarations", "function_declarations") or []):
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise _refuse(f"tools.{i}.functionDeclarations.{k}.name", "a function declaration needs a name")
            schema = fn.get("parametersJsonSchema") or fn.get("parameters") or {"type": "object", "properties": {}}
            function = {"name": fn["name"], "description": fn.get("description") or "", "parameters": schema}
            out.append({"type": "function", "function": function})
    return out or None


def _text(parts: Any, field: str) -> str:
    if not isinstance(parts, list):
        raise _refuse(field, f"{field} must be a list of parts")
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def _result(response: Any) -> str:
    if isinstance(response, dict) and len(response) == 1:
        (only,) = response.values()
        if isinstance(only, str) and next(iter(response)) in ("output", "result", "content"):
            return only
    return json.dumps(response, ensure_ascii=False)


def messages(body: dict[str, Any], req: GeminiRequest) -> list[TemplateMessage]:
    out: list[TemplateMessage] = []
    system = _get(body, "systemInstruction", "system_instruction")
    if system:
        text = system if isinstance(system, str) else _text(system.get("parts"), "systemInstruction.parts")
        out.append({"role": "system", "content": text})
    for i, content in enumerate(req.contents):
        field = f"contents.{i}"
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
            raise _refuse(f"{field}.parts", f"{field}.parts must be a list of parts")
        role = content.get("role", "user")
        if role not in ("user", "model", "function", "tool"):
            raise _refuse(f"{field}.role", f"{field}.role {role!r} is not user or model")
        texts, calls, results = [], [], []
        for k, part in enumerate(content["parts"]):
            where = f"{field}.parts.{k}"
            if not isinstance(part, dict):
                raise _refuse(where, f"{where} must be an object")
            signature = part.get("thoughtSignature", part.get("thought_signature"))
            if part.get("thought"):
                texts.append(reasoning.unseal(signature, str(part.get("text", ""))))
            elif signature is not None:
                texts.append(reasoning.unseal(signature, ""))  # a signature of ours carries the reasoning
            if part.get("thought"):
                continue
            call = _get(part, "functionCall", "function_call")
            response = _get(part, "functionResponse", "function_response")
            if "text" in part:
                texts.append(str(part["text"]))
            elif isinstance(call, dict) and isinstance(call.get("name"), str):
                args = call.get("args") or {}
                if not isinstance(args, dict):
                    raise _refuse(f"{where}.functionCall.args", "functionCall.args must be an object")
                calls.append(template_call(call["name"], args))
            elif isinstance(response, dict):
                results.append({"role": "tool", "content": _result(response.get("response"))})
            elif signature is None:
                kinds = ", ".join(sorted(part)) or "empty"
                raise _refuse(where, f"{where}: part {kinds!r} is not served (text and function parts only)")
        out.extend(results)
        if texts or calls or not results:
            message: TemplateMessage = {"role": "assistant" if role == "model" else "user", "content": "".join(texts)}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
    return out


def parts(result: TurnResult, thoughts: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    text = result.parsed.content
    if thoughts:
        split = reasoning.split(text)
        if split.raw:
            out.append({"text": split.text, "thought": True, "thoughtSignature": reasoning.seal(split.raw)})
        text = split.rest
    if text or not result.parsed.calls:
        out.append({"text": text})
    for k, (name, args) in enumerate(result.parsed.calls):
        out.append({"functionCall": {"id": f"call_{result.index}_{k}", "name": name, "args": args}})
    return out


def _usage(result: TurnResult) -> dict[str, Any]:
    prompt, output = len(result.plan.prompt_ids), len(result.answer.output_ids)
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output,
        "cachedContentTokenCount": result.answer.cached_tokens,
    }


def _chunk(result: TurnResult, model: str, content: list[dict[str, Any]], last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": content}, "index": 0}
    doc: dict[str, Any] = {"candidates": [candidate], "modelVersion": model,
                           "responseId": f"gen_{result.view.session.session}_{result.index}"}  # fmt: skip
    if last:
        candidate["finishReason"] = "MAX_TOKENS" if result.truncated else "STOP"
        doc["usageMetadata"] = _usage(result)
        doc["promptTokenIds"], doc["outputTokenIds"] = result.plan.prompt_ids, result.answer.output_ids
    return doc


def response(result: TurnResult, model: str, thoughts: bool) -> dict[str, Any]:
    return _chunk(result, model, parts(result, thoughts), last=True)


def chunks(result: TurnResult, model: str, thoughts: bool) -> list[dict[str, Any]]:
    every = parts(result, thoughts)
    return [_chunk(result, model, [part], last=k == len(every) - 1) for k, part in enumerate(every)]


async def send_stream(request: web.Request, docs: list[dict[str, Any]]) -> web.StreamResponse:
    """``alt=sse``: one ``data:`` event per chunk; otherwise the chunks as one JSON array."""
    sse = request.query.get("alt") == "sse"
    kind = "text/event-stream" if sse else "application/json"
    stream = web.StreamResponse(headers={"Content-Type": kind, "Cache-Control": "no-cache"})
    await stream.prepare(request)
    if sse:
        await stream.write(b"".join(b"data: " + orjson.dumps(d) + b"\r\n\r\n" for d in docs))
    else:
        await stream.write(orjson.dumps(docs))
    await stream.write_eof()
    return stream

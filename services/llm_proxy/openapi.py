"""``GET /openapi.json``: the proxy's routes as an OpenAPI 3.1 document (for clients and fuzzing).

Admin bodies come from their pydantic models; the data-plane bodies describe what the proxy
itself checks (``shapes.py``): everything else in them is the engine's SGLang/OpenAI API.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from services.llm_proxy.adapters import AdapterChange
from services.llm_proxy.admin import EngineJoin, EngineRef
from services.llm_proxy.shapes import MAX_DEADLINE_S, MAX_TOKEN_ID, MIN_DEADLINE_S
from services.protocol import llm as h
from services.protocol.errors import ErrorBody
from services.protocol.weights import WeightUpdate

_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}}
_SAMPLING = {"type": "object", "properties": {"max_new_tokens": {"type": "integer", "minimum": 0}}}
GENERATE = {"type": "object", "required": ["input_ids"], "properties": {
    "input_ids": _TOKEN_IDS, "sampling_params": _SAMPLING, "return_logprob": {"type": "boolean"}}}  # fmt: skip
CHAT = {"type": "object", "required": ["messages"], "properties": {
    "model": {"type": "string"}, "max_tokens": {"type": "integer", "minimum": 0},
    "messages": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role", "content"],
                 "properties": {"role": {"type": "string"}, "content": {"type": "string"}}}}}}  # fmt: skip
COMPLETION = {"type": "object", "required": ["prompt"], "properties": {
    "model": {"type": "string"}, "max_tokens": {"type": "integer", "minimum": 0},
    "prompt": {"oneOf": [{"type": "string"},
                         {"type": "array", "minItems": 1, "items": {"type": "string"}}]}}}  # fmt: skip
DATA_HEADERS = [
    {"name": h.HEADER_POOL, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": h.HEADER_SESSION, "in": "header", "required": False,
     "schema": {"type": "string", "pattern": "^[!-~]{1,256}$"}},
    {"name": h.HEADER_DEADLINE, "in": "header", "required": False,
     "schema": {"type": "number", "minimum": MIN_DEADLINE_S, "maximum": MAX_DEADLINE_S}},
]  # fmt: skip


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _op(summary: str, body: dict[str, Any] | None = None, *, public: bool = False, params: Any = None) -> Any:
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {"application/json": {"schema": {}}}},
        "default": {"description": "an error", "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/ErrorBody"}}}}}}  # fmt: skip
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if public:
        op["security"] = []
    if params:
        op["parameters"] = params
    return op


def document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [EngineJoin, EngineRef, WeightUpdate, AdapterChange, ErrorBody]
    schemas: dict[str, Any] = {}
    for model in models:
        schema = _schema(model)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    ref = {m.__name__: {"$ref": f"#/components/schemas/{m.__name__}"} for m in models}
    paths = {
        "/healthz": {"get": _op("liveness", public=True)},
        "/metrics": {"get": _op("Prometheus metrics", public=True)},
        "/v1/models": {"get": _op("one model per pool")},
        "/generate": {"post": _op("SGLang native generate", GENERATE, params=DATA_HEADERS)},
        "/v1/chat/completions": {"post": _op("OpenAI chat", CHAT, params=DATA_HEADERS)},
        "/v1/completions": {"post": _op("OpenAI completions", COMPLETION, params=DATA_HEADERS)},
        "/admin/status": {"get": _op("pools and engines")},
        "/admin/engines": {"post": _op("add an engine", ref["EngineJoin"])},
        "/admin/engines/move": {"post": _op("move an engine to a pool", ref["EngineJoin"])},
        "/admin/engines/drain": {"post": _op("drain an engine", ref["EngineRef"])},
        "/admin/engines/remove": {"post": _op("remove an engine", ref["EngineRef"])},
        "/admin/weights": {"post": _op("fleet-wide weight update (admin, or the pool's job)", ref["WeightUpdate"])},
        "/admin/lora": {"post": _op("load or unload a LoRA adapter", ref["AdapterChange"])},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "rollout LLM proxy", "version": "1"},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }

"""SGLang's native routes: ``/generate`` and the control plane."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from services.engines.batching import Generation
from services.engines.engine import Engine, EngineRequestError, GenerateParams
from services.engines.replay import add_replay_fields
from services.engines.responses import json_response, read_json, sglang_error, stream_sse, wait_done

ENGINE = web.AppKey("engine", Engine)
PAUSE_MODES = ("abort", "retract", "in_place")
FLUSH_MESSAGE = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def prompt_ids_of(engine: Engine, body: dict[str, Any]) -> list[int]:
    ids = body.get("input_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise EngineRequestError("input_ids must be a flat list of integers (batches are not supported).")
        return ids
    text = body.get("text")
    if not isinstance(text, str):
        raise EngineRequestError("Either text or input_ids should be provided.")
    return engine.encode_text(text)


def params_of(body: dict[str, Any]) -> GenerateParams:
    sampling = body.get("sampling_params") or {}
    max_new = sampling.get("max_new_tokens")
    return GenerateParams(
        max_new_tokens=None if max_new is None else int(max_new),
        ignore_eos=bool(sampling.get("ignore_eos", False)),
        stream=bool(body.get("stream", False)),
        return_logprob=bool(body.get("return_logprob", False)),
        temperature=float(sampling.get("temperature", 1.0)),
        top_p=float(sampling.get("top_p", 1.0)),
        seed=None if sampling.get("sampling_seed") is None else int(sampling["sampling_seed"]),
        logprob_start_len=int(body.get("logprob_start_len", -1)),
    )


def native_output(
    engine: Engine, gen: Generation, prompt_ids: list[int], logprobs: bool, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    out = engine.output_ids(gen)
    doc: dict[str, Any] = {}
    if engine.codec is not None:
        doc["text"] = engine.codec.decode_visible(out)
    doc["output_ids"] = out
    doc["meta_info"] = engine.meta_info(gen, prompt_ids, logprobs=logprobs)
    if body:
        add_replay_fields(engine.settings, body, doc["meta_info"], prompt_ids, out)
    return doc


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    try:
        body = await read_json(request)
        lora = body.get("lora_path")
        if lora is not None and lora not in engine.lora_adapters:
            raise EngineRequestError(f"LoRA adapter {lora} is not loaded.")
        prompt_ids = prompt_ids_of(engine, body)
        params = params_of(body)
        gen = await engine.generate(prompt_ids, params, body.get("rid"))
    except (EngineRequestError, ValueError, TypeError) as exc:
        return sglang_error(str(exc))
    if params.stream:
        resp = await stream_sse(
            request, engine, gen, lambda _sent, _final: [native_output(engine, gen, prompt_ids, params.return_logprob)]
        )
        engine.record_finished(gen, prompt_ids)
        return resp
    await wait_done(engine, gen)
    engine.record_finished(gen, prompt_ids)
    return json_response(native_output(engine, gen, prompt_ids, params.return_logprob, body))


async def load_lora_adapter(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await read_json(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not isinstance(path, str):
        return json_response({"success": False, "error_message": "lora_name and lora_path are required"}, 400)
    engine.lora_adapters[name] = path
    return json_response({"success": True, "error_message": "", "loaded_adapters": engine.lora_adapters})


async def unload_lora_adapter(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await read_json(request)
    name = body.get("lora_name")
    if engine.lora_adapters.pop(str(name), None) is None:
        return json_response({"success": False, "error_message": f"LoRA adapter {name} is not loaded"}, 400)
    return json_response({"success": True, "error_message": "", "loaded_adapters": engine.lora_adapters})


async def pause_generation(request: web.Request) -> web.Response:
    body = await read_json(request)
    mode = body.get("mode", "abort")
    if mode not in PAUSE_MODES:
        return sglang_error(f"mode must be one of {PAUSE_MODES}")
    request.app[ENGINE].pause(mode)
    return json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    request.app[ENGINE].resume()
    return json_response({"message": "Generation continued successfully.", "status": "ok"})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await read_json(request)
    if not isinstance(body.get("model_path"), str):
        return json_response({"success": False, "message": "model_path is required", "num_paused_requests": 0}, 400)
    version = body.get("weight_version")
    ok, message = await engine.update_weights(
        body["model_path"], None if version is None else str(version), abort_all=bool(body.get("abort_all_requests"))
    )
    return json_response({"success": ok, "message": message, "num_paused_requests": 0}, 200 if ok else 400)


async def abort_request(request: web.Request) -> web.Response:
    body = await read_json(request)
    request.app[ENGINE].scheduler.abort(str(body.get("rid") or ""), abort_all=bool(body.get("abort_all")))
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    ok = request.app[ENGINE].flush_cache()
    return web.Response(text=FLUSH_MESSAGE, status=200 if ok else 400)


async def get_model_info(request: web.Request) -> web.Response:
    return json_response(request.app[ENGINE].model_info())


async def get_server_info(request: web.Request) -> web.Response:
    return json_response(request.app[ENGINE].server_info())


async def get_load(request: web.Request) -> web.Response:
    return json_response(request.app[ENGINE].load())


async def get_weight_version(request: web.Request) -> web.Response:
    return json_response({"weight_version": request.app[ENGINE].weight_version})


async def update_weight_version(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await read_json(request)
    if body.get("abort_all_requests"):
        engine.scheduler.abort("", abort_all=True)
    engine.weight_version = str(body.get("new_version", engine.weight_version))
    return json_response({"success": True, "message": "ok"})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def health_generate(request: web.Request) -> web.Response:
    """A one-token generation through the batch, unless generation is paused."""
    engine = request.app[ENGINE]
    if engine.scheduler.paused:
        return web.Response(status=200)
    gen = await engine.generate([0], GenerateParams(max_new_tokens=1), f"HEALTH_CHECK_{id(request)}")
    try:
        await asyncio.wait_for(wait_done(engine, gen), timeout=20)
    except TimeoutError:
        engine.cancel(gen)
        return web.Response(status=503)
    return web.Response(status=200)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "engine_id": request.app[ENGINE].engine_id})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[ENGINE].render_metrics(), content_type="text/plain")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/generate", generate)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/unload_lora_adapter", unload_lora_adapter)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_route("*", "/flush_cache", flush_cache)
    for path in ("/get_model_info", "/model_info"):
        app.router.add_get(path, get_model_info)
    for path in ("/get_server_info", "/server_info"):
        app.router.add_get(path, get_server_info)
    app.router.add_get("/get_load", get_load)
    app.router.add_get("/get_weight_version", get_weight_version)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)

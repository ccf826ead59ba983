"""``create_app(settings, port)``: one engine's aiohttp application."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from services.engines import native, openai
from services.engines.engine import Engine
from services.engines.replies import ReplySource, SimulatedReplies
from services.engines.scripted import Script, ScriptedReplies
from services.engines.settings import EngineSettings
from services.engines.staging import add_stage_route
from services.engines.tokenization import TextCodec


def load_codec(settings: EngineSettings) -> TextCodec | None:
    """The model directory's tokenizer; scripted mode falls back to the bundled one."""
    if settings.model_path is not None:
        return TextCodec.from_dir(settings.model_path)
    return TextCodec.bundled() if settings.mode == "scripted" else None


def build_replies(settings: EngineSettings, codec: TextCodec | None) -> ReplySource:
    """The reply source for the mode (a factory keyed by ``settings.mode``)."""
    if settings.mode == "scripted":
        if settings.script is None or codec is None:
            raise ValueError("scripted mode needs --script FILE")
        return ScriptedReplies(Script.load(settings.script), codec)
    if settings.mode == "torch":
        if settings.model_path is None:
            raise ValueError("torch mode needs --model-path DIR (an HF causal LM with its tokenizer)")
        from services.engines.torch_model import TorchPolicy, TorchReplies  # torch only where needed

        return TorchReplies(TorchPolicy(settings.model_path, seed=settings.seed))
    return SimulatedReplies(settings.seed, settings.output_tokens, settings.runaway_fraction)


def create_app(settings: EngineSettings, port: int) -> web.Application:
    codec = load_codec(settings)
    engine = Engine(settings, port, build_replies(settings, codec), codec)
    app = web.Application(client_max_size=1024**3)
    app[native.ENGINE] = engine
    native.add_routes(app)
    openai.add_routes(app)
    add_stage_route(app, settings.weight_cache_dir / f"engine-{port}")

    async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
        await engine.start()
        yield
        await engine.stop()

    app.cleanup_ctx.append(lifecycle)
    return app

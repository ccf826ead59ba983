"""The data plane: one LLM call from the client to an engine and back.

Parse, pick the pool, apply the context guard, mint the rid, hold while the pool's weights are
being updated, choose an engine, forward (retrying on another engine when the connection failed
before an answer), relay the answer with provenance, and abort the engine's request when the
client goes away or the deadline passes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from services.llm_proxy.admission import Admission
from services.llm_proxy.body import ParsedBody
from services.llm_proxy.fleet import EngineRuntime, FleetView
from services.llm_proxy.guard import ContextGuard, is_engine_length_error
from services.llm_proxy.membership import MembershipStore
from services.llm_proxy.metrics import ProxyMetrics
from services.llm_proxy.responses import CallRequest, error_frame, error_response, json_response, read_body
from services.llm_proxy.routing import Router
from services.llm_proxy.settings import ProxySettings
from services.llm_proxy.shapes import check_shape, deadline_of, session_of
from services.llm_proxy.upstream import (
    BackgroundTasks,
    EngineClient,
    EngineLinks,
    NotAnswered,
    SlowConnect,
    engine_message,
    post,
    post_streaming,
    token_counts,
)
from services.protocol import ErrorCode, PlatformError
from services.protocol import llm as h
from services.protocol.status import request_error_code
from services.runtime.http_client import Disconnected

GENERATE = "/generate"
# a native call's answer (``Forwarder.native_call``) carries the engine's decoded document here, not
# encoded again as a body: the gateway reads it in the same process
NATIVE_DOC = web.ResponseKey("native_doc", dict)
# why a call was cancelled (the abort's reason): the gateway cancels an engine call it started early
# with REPLANNED (its guess was not confirmed) or DROPPED (the call was refused or failed first)
DISCONNECT, REPLANNED, DROPPED = "disconnect", "replanned", "dropped"


@dataclass(slots=True)
class Call:
    route: str
    pool: str
    body: ParsedBody
    rid: str
    session: str | None
    deadline_s: float | None
    stream: bool
    started: float
    deadline_at: float | None = None  # loop time; the same for every engine the call is tried on
    upstream_s: float = 0.0
    native: bool = False  # built inside the proxy: a 200 answer's document comes back as ``NATIVE_DOC``


class Forwarder:
    """Serves ``/generate``, ``/v1/chat/completions`` and ``/v1/completions``."""

    def __init__(
        self,
        settings: ProxySettings,
        view: FleetView,
        store: MembershipStore,
        session: aiohttp.ClientSession,
        metrics: ProxyMetrics,
        background: BackgroundTasks,
        admission: Admission,
    ) -> None:
        self.settings = settings
        self.admission = admission
        self.view = view
        self.store = store
        self.session = session
        self.metrics = metrics
        self.background = background
        self.engines = EngineClient(session, settings.health_timeout_s)
        self.links = EngineLinks(settings)  # the non-streaming calls' transport
        self.guard = ContextGuard(settings.context_cap, settings.max_new_tokens_cap)
        self.router = Router(settings.affinity_overload_factor, settings.affinity_overload_slack)
        self.rng = random.Random()
        self.held_now = 0
        self._rid_prefix = secrets.token_hex(8)  # random per process
        self._rid_counter = itertools.count()

    def mint_rid(self) -> str:
        """32 hex characters: a random per-process prefix and a counter. All rids have the same length,
        so none is a prefix of another (SGLang's ``/abort_request`` matches by prefix)."""
        return f"{self._rid_prefix}{next(self._rid_counter):016x}"

    async def handle(self, request: CallRequest) -> web.StreamResponse:
        started = time.perf_counter()
        rid = self.mint_rid()
        try:
            call = await self._prepare(request, rid, started)
            return await self.send(request, call)
        except PlatformError as exc:
            self.metrics.errors.labels("-", exc.code.value).inc()
            return error_response(exc, {h.HEADER_RID: rid})

    def native_call(
        self, pool: str, body: dict[str, Any], prompt_len: int, session: str | None, deadline_s: float | None
    ) -> Call:
        """A non-streaming ``/generate`` call built inside the proxy (the agent gateway): guarded and given
        a rid like a client's call. ``body`` holds ``input_ids``; raises ``PlatformError`` on a guard refusal."""
        started = time.perf_counter()
        self.guard.guard_generate(body, prompt_len)
        rid = body["rid"] = self.mint_rid()
        deadline_at = None if deadline_s is None else asyncio.get_running_loop().time() + deadline_s
        return Call(
            route=GENERATE, pool=pool, body=ParsedBody(body, None, prompt_len), rid=rid, session=session,
            deadline_s=deadline_s, stream=False, started=started, deadline_at=deadline_at, native=True,
        )  # fmt: skip

    async def send(self, request: CallRequest, call: Call) -> web.StreamResponse:
        """What every call goes through: held while its pool's weights update, queued while every engine
        is saturated, routed, forwarded (retried elsewhere when unanswered), answered with provenance."""
        await self._hold(call.pool)
        return await self._dispatch(request, call)

    async def _prepare(self, request: CallRequest, rid: str, started: float) -> Call:
        route = request.path
        parsed = await read_body(request)
        body = parsed.doc
        check_shape(route, parsed)
        pool = self._pool_of(request, body, route)
        if route == GENERATE:
            self.guard.guard_parsed(parsed)
        else:
            self.guard.guard_openai(body)
        body["rid"] = rid
        session = session_of(request, body)
        deadline_s = deadline_of(request, self.settings.default_deadline_s)
        deadline_at = None if deadline_s is None else asyncio.get_running_loop().time() + deadline_s
        return Call(
            route=route, pool=pool, body=parsed, rid=rid, session=session,
            deadline_s=deadline_s, stream=bool(body.get("stream")), started=started, deadline_at=deadline_at,
        )  # fmt: skip

    def _pool_of(self, request: CallRequest, body: dict[str, Any], route: str) -> str:
        pools = self.view.fleet.pools
        model = body.get("model")
        if route != GENERATE and isinstance(model, str) and model in pools:
            return model
        pool = request.headers.get(h.HEADER_POOL, self.settings.pool)
        if pool not in pools:
            raise PlatformError(ErrorCode.UNKNOWN_POOL, f"no pool named {pool!r}", field=h.HEADER_POOL)
        return pool

    async def _hold(self, pool: str) -> None:
        """While the pool's weights are being updated, wait here (bounded) instead of failing."""
        ready = self.view.ready_event(pool)
        if ready.is_set():
            return
        if self.held_now >= self.settings.hold_queue_max:
            raise PlatformError(ErrorCode.ENGINE_UNAVAILABLE, "weight update running; hold queue full", retry_after_s=5)
        record = self.view.pool(pool)
        timeout = record.hold_timeout_s if record else 300.0
        self.held_now += 1
        self.metrics.held.labels(pool).inc()
        self.metrics.held_total.labels(pool).inc()
        self.background.spawn(self.store.count_held(pool))
        try:
            await asyncio.wait_for(ready.wait(), timeout)
        except TimeoutError:
            raise PlatformError(
                ErrorCode.ENGINE_UNAVAILABLE, f"weight update of pool {pool} still running", retry_after_s=5
            ) from None
        finally:
            self.held_now -= 1
            self.metrics.held.labels(pool).dec()

    async def _dispatch(self, request: CallRequest, call: Call) -> web.StreamResponse:
        payload = call.body.encode()
        tried: set[str] = set()  # engines that refused or reset: not tried again for this call
        slow: set[str] = set()  # engines slow to connect: others first, then these again

        def untried() -> list[EngineRuntime]:
            routable = self.view.routable(call.pool)
            return [e for e in routable if e.url not in tried] if tried else routable

        while len(tried) <= self.settings.retries:
            free = await self.admission.engines(call.pool, untried, len(payload), call.deadline_at)
            engines = ([e for e in free if e.url not in slow] or free) if slow else free
            if not engines:
                break
            rt = self.router.choose(engines, call.session, self.rng)
            try:
                return await self._forward(request, call, rt, payload)
            except SlowConnect:  # busy, not down: try again (the call's deadline still bounds it)
                slow.add(rt.url)
                self.metrics.connect_retries.labels(rt.engine_id).inc()
            except NotAnswered as exc:
                tried.add(rt.url)
                self.view.mark_failed(rt, str(exc))
                self.metrics.retries.labels(rt.engine_id).inc()
                self.background.spawn(self.engines.abort(rt.url, call.rid))  # in case it did arrive
        raise PlatformError(
            ErrorCode.NO_HEALTHY_ENGINE, f"no healthy engine in pool {call.pool} (tried {len(tried)})", retry_after_s=1
        )

    async def _forward(self, request: CallRequest, call: Call, rt: EngineRuntime, payload: bytes) -> web.StreamResponse:
        rt.in_flight += 1  # the in-flight gauge is set from this count (tally.py)
        sent = time.perf_counter()
        deadline_at = call.deadline_at
        try:
            if not call.stream:
                async with asyncio.timeout_at(deadline_at):
                    status, raw = await post(self.links.to(rt.url), call.route, payload)
                call.upstream_s = time.perf_counter() - sent
                self.view.mark_ok(rt)
                return self._answer(call, rt, status, raw)
            async with asyncio.timeout_at(deadline_at):
                resp = await post_streaming(self.session, rt.endpoint(call.route), payload)
                if call.stream and resp.status == 200:
                    assert isinstance(request, web.Request)  # the lean server hands streams to aiohttp
                    async with resp:
                        return await self._relay_stream(request, call, rt, resp, sent, deadline_at)
                async with resp:
                    raw = await resp.read()
            call.upstream_s = time.perf_counter() - sent
            self.view.mark_ok(rt)
            return self._answer(call, rt, resp.status, raw)
        except TimeoutError:
            self._abort(rt, call, "deadline")
            return self._fail(call, rt, ErrorCode.UPSTREAM_TIMEOUT, f"no answer within {call.deadline_s} s")
        except asyncio.CancelledError as exc:  # the client went away, or the gateway dropped an early call
            reason = exc.args[0] if exc.args and exc.args[0] in (REPLANNED, DROPPED) else DISCONNECT
            self._abort(rt, call, reason)
            raise
        except (aiohttp.ClientError, Disconnected) as exc:  # the answer broke off after the request was sent
            self.view.mark_failed(rt, str(exc))
            self._abort(rt, call, "upstream_error")
            return self._fail(call, rt, ErrorCode.ENGINE_UNAVAILABLE, f"engine connection failed: {exc}")
        finally:
            rt.in_flight -= 1
            self.admission.released(call.pool)

    def _abort(self, rt: EngineRuntime, call: Call, reason: str) -> None:
        self.metrics.aborts.labels(reason).inc()
        self.background.spawn(self.engines.abort(rt.url, call.rid))

    def _provenance(self, call: Call, rt: EngineRuntime, version: object) -> dict[str, str]:
        headers = {h.HEADER_ENGINE: rt.engine_id, h.HEADER_RID: call.rid}
        if version is None:
            pool = self.view.pool(call.pool)
            version = pool.version if pool and pool.version else rt.weight_version
        if version is not None:
            headers[h.HEADER_WEIGHT_VERSION] = str(version)
        return headers

    def _answer(self, call: Call, rt: EngineRuntime, status: int, raw: bytes) -> web.Response:
        if status != 200:
            return self._engine_error(call, rt, status, raw)
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._fail(
                call, rt, ErrorCode.ENGINE_ERROR, f"engine answered 200 with a non-JSON body: {raw[:200]!r}"
            )
        version = self._stamp(call, doc, rt)
        if version is not None:
            rt.weight_version = str(version)
        self._observe(call, rt, "200", doc)
        if call.native and isinstance(doc, dict):
            answer = web.Response(status=200, headers=self._provenance(call, rt, version))
            answer[NATIVE_DOC] = doc
            return answer
        return json_response(doc, 200, self._provenance(call, rt, version))

    def _stamp(self, call: Call, doc: Any, rt: EngineRuntime) -> object:
        """Add the engine id to the answer; return the weight version the engine reported."""
        if not isinstance(doc, dict):
            return None
        if call.route == GENERATE:
            meta = doc.get("meta_info")
            if isinstance(meta, dict):
                meta[h.META_ENGINE] = rt.engine_id
                return meta.get("weight_version")
            return None
        metadata = doc.setdefault("metadata", {})
        if isinstance(metadata, dict):
            metadata[h.META_ENGINE] = rt.engine_id
            return metadata.get("weight_version")
        return None

    def _engine_error(self, call: Call, rt: EngineRuntime, status: int, raw: bytes) -> web.Response:
        message = engine_message(raw)
        if status == 400 and is_engine_length_error(message):
            return self._fail(call, rt, ErrorCode.CONTEXT_LENGTH_EXCEEDED, message)
        if 400 <= status < 500:
            return self._fail(call, rt, request_error_code(status), message)
        self.view.mark_failed(rt, f"HTTP {status}")
        return self._fail(call, rt, ErrorCode.ENGINE_ERROR, f"engine answered {status}: {message}")

    def _fail(self, call: Call, rt: EngineRuntime, code: ErrorCode, message: str) -> web.Response:
        exc = PlatformError(code, message)
        self.metrics.errors.labels(rt.engine_id, code.value).inc()
        self._observe(call, rt, str(exc.status), None)
        return error_response(exc, self._provenance(call, rt, None))

    def _observe(self, call: Call, rt: EngineRuntime, code: str, doc: Any) -> None:
        elapsed = time.perf_counter() - call.started
        m, tally = self.metrics, self.metrics.tally
        series = m.engine(rt.engine_id)
        tally.count(m.call_done(rt.engine_id, call.route, code))
        tally.observe(series.latency, elapsed)
        if call.upstream_s:
            tally.observe(m.overhead, max(0.0, elapsed - call.upstream_s))
        prompt, completion = token_counts(doc)
        if prompt:
            tally.count(series.prompt_tokens, prompt)
        if completion:
            tally.count(series.completion_tokens, completion)

    async def _relay_stream(
        self,
        request: web.Request,
        call: Call,
        rt: EngineRuntime,
        resp: aiohttp.ClientResponse,
        sent: float,
        deadline_at: float | None,
    ) -> web.StreamResponse:
        """Relay SSE frames, tagging each with the engine id. Failures after the first byte end the
        stream with an error frame (the status line is already sent)."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        out = web.StreamResponse(status=200, headers={**headers, **self._provenance(call, rt, None)})
        await out.prepare(request)
        failure: PlatformError | None = None
        try:
            async with asyncio.timeout_at(deadline_at):
                await self._pump(call, rt, resp, out)
        except TimeoutError:
            self._abort(rt, call, "deadline")
            failure = PlatformError(ErrorCode.UPSTREAM_TIMEOUT, f"no answer within {call.deadline_s} s")
        except aiohttp.ClientError as exc:
            self.view.mark_failed(rt, str(exc))
            self._abort(rt, call, "upstream_error")
            failure = PlatformError(ErrorCode.ENGINE_UNAVAILABLE, f"engine connection failed: {exc}")
        except ConnectionResetError:  # the client went away mid-stream
            self._abort(rt, call, "disconnect")
            return out
        if failure is not None:
            self.metrics.errors.labels(rt.engine_id, failure.code.value).inc()
            await out.write(error_frame(failure))
        else:
            self.view.mark_ok(rt)
            call.upstream_s = time.perf_counter() - sent
            self._observe(call, rt, "200", None)
        await out.write_eof()
        return out

    async def _pump(self, call: Call, rt: EngineRuntime, resp: aiohttp.ClientResponse, out: web.StreamResponse) -> None:
        buffer = b""
        async for chunk in resp.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                frame, buffer = buffer.split(b"\n\n", 1)
                await out.write(self._tag_frame(call, rt, frame) + b"\n\n")
        if buffer:
            await out.write(buffer)

    def _tag_frame(self, call: Call, rt: EngineRuntime, frame: bytes) -> bytes:
        if not frame.startswith(b"data: {"):
            return frame
        doc = orjson.loads(frame[6:])
        self._stamp(call, doc, rt)
        return b"data: " + orjson.dumps(doc)

"""The proxy's data plane against real engine processes: provenance, affinity, guard, streaming,
aborts, deadlines, membership."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest
import redis

from services.protocol import llm as h
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.tokenizer import write_tokenizer_dir
from tests.llm_proxy.fleet import engine_states, generate, start_engines, start_proxy, wait_until

EOS = 258  # the bundled tokenizer's end of sequence
LONG = {"max_new_tokens": 2000, "ignore_eos": True}  # ~10 s at 5 ms a step: only ends by abort


@dataclass
class Fleet:
    proxy: str
    engines: list[str]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_server: EmbeddedRedis) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("proxy")
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    tok = write_tokenizer_dir(root / "model")
    engines_svc, urls = start_engines(root / "logs", 3, "--model-path", str(tok), "--context-length", "8192")
    proxy = None
    try:
        proxy = start_proxy(
            root / "logs", redis_server.url, urls, "--context-cap", "4096", "--max-new-tokens-cap", "200"
        )
        yield Fleet(proxy.url, urls)
    finally:
        if proxy is not None:
            proxy.stop()
        engines_svc.stop()


def test_generate_carries_provenance_and_rid(fleet: Fleet) -> None:
    resp = generate(fleet.proxy, {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    assert resp.status_code == 200
    doc = resp.json()
    engine_id = resp.headers[h.HEADER_ENGINE]
    assert doc["meta_info"][h.META_ENGINE] == engine_id and engine_id in {u[len("http://") :] for u in fleet.engines}
    assert resp.headers[h.HEADER_WEIGHT_VERSION] == doc["meta_info"]["weight_version"] == "default"
    assert resp.headers[h.HEADER_RID] == doc["meta_info"]["id"] and len(doc["meta_info"]["id"]) == 32


def test_session_affinity_is_sticky_across_processes_and_spreads_sessions(fleet: Fleet) -> None:
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
    sticky = {generate(fleet.proxy, body, {h.HEADER_SESSION: "traj-42"}).headers[h.HEADER_ENGINE] for _ in range(8)}
    assert len(sticky) == 1  # eight calls on fresh connections land on both processes, same engine
    in_body = {generate(fleet.proxy, {**body, h.BODY_SESSION: "traj-42"}).headers[h.HEADER_ENGINE] for _ in range(3)}
    assert in_body == sticky
    spread = {generate(fleet.proxy, body, {h.HEADER_SESSION: f"s{i}"}).headers[h.HEADER_ENGINE] for i in range(12)}
    assert len(spread) >= 2


def test_context_guard_refuses_and_clamps(fleet: Fleet) -> None:
    refused = generate(fleet.proxy, {"input_ids": [7] * 4096})
    assert refused.status_code == 400
    err = refused.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["infra"] is False
    clamped = generate(
        fleet.proxy, {"input_ids": [7] * 4000, "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    )
    assert clamped.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 95}  # 4096 - 4000 - 1
    capped = generate(fleet.proxy, {"input_ids": [8, 9], "sampling_params": {"ignore_eos": True}})
    assert capped.json()["meta_info"]["completion_tokens"] == 200  # max_new_tokens always set
    text = generate(fleet.proxy, {"text": "x" * 9000})  # the engine (8,192 context) refuses; same code
    assert text.status_code == 400 and text.json()["error"]["code"] == "context_length_exceeded"


def test_streaming_generate_and_chat_are_relayed_with_engine_id(fleet: Fleet) -> None:
    body = {"input_ids": [1, 2], "stream": True, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    with httpx.stream("POST", fleet.proxy + "/generate", json=body, timeout=30) as resp:
        engine_id = resp.headers[h.HEADER_ENGINE]
        assert resp.headers[h.HEADER_WEIGHT_VERSION] == "default"  # known before the first token
        frames = [ln[6:] for ln in resp.iter_lines() if ln.startswith("data: ")]
    assert frames[-1] == "[DONE]" and len(frames) >= 3
    assert all(json.loads(f)["meta_info"][h.META_ENGINE] == engine_id for f in frames[:-1])
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", fleet.proxy + "/v1/chat/completions", json=chat, timeout=30) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_openai_routes_and_unknown_pool(fleet: Fleet) -> None:
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    resp = httpx.post(fleet.proxy + "/v1/chat/completions", json=chat, timeout=30)
    assert resp.status_code == 200 and resp.json()["metadata"][h.META_ENGINE] == resp.headers[h.HEADER_ENGINE]
    assert [m["id"] for m in httpx.get(fleet.proxy + "/v1/models").json()["data"]] == ["default"]
    unknown = generate(fleet.proxy, {"input_ids": [1]}, {h.HEADER_POOL: "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_pool"


def test_openai_routes_return_the_engines_logprobs(fleet: Fleet) -> None:
    """``logprobs`` / ``top_logprobs`` on the plain OpenAI routes: the values ``/generate`` gives for the
    same prompt on the same engine (they answered ``"logprobs": null`` before, issue 29)."""
    from services.engines.tokenization import TextCodec, render_chat

    codec = TextCodec.bundled()
    messages = [{"role": "user", "content": "count the lines"}]
    pin = {h.HEADER_SESSION: "logprobs-1"}  # one engine for every call below
    ids = codec.encode(render_chat(messages))
    body = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 3, "sampling_params": {"max_new_tokens": 6}}
    native = generate(fleet.proxy, body, pin).json()
    want = [(codec.decode([t]), lp) for lp, t, _ in native["meta_info"]["output_token_logprobs"] if t != EOS]
    top = [[(codec.decode([t]), lp) for lp, t, _ in pos] for pos in native["meta_info"]["output_top_logprobs"]]
    chat = {"model": "default", "messages": messages, "max_tokens": 6, "logprobs": True, "top_logprobs": 3}
    got = httpx.post(fleet.proxy + "/v1/chat/completions", json=chat, headers=pin, timeout=30).json()
    content = got["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"]) for c in content] == want and want
    assert [[(a["token"], a["logprob"]) for a in c["top_logprobs"]] for c in content] == top[: len(content)]
    assert all(c["bytes"] == list(c["token"].encode()) for c in content)
    legacy = {"model": "default", "prompt": ids, "max_tokens": 6, "logprobs": 2}
    done = httpx.post(fleet.proxy + "/v1/completions", json=legacy, headers=pin, timeout=30).json()
    lp = done["choices"][0]["logprobs"]
    everything = [(codec.decode([t]), v) for v, t, _ in native["meta_info"]["output_token_logprobs"]]
    assert list(zip(lp["tokens"], lp["token_logprobs"], strict=True)) == everything
    assert [list(d.values()) for d in lp["top_logprobs"]] == [[v for _, v in pos[:2]] for pos in top]
    with httpx.stream("POST", fleet.proxy + "/v1/chat/completions", json={**chat, "stream": True}, headers=pin,
                      timeout=30) as resp:  # fmt: skip
        frames = [json.loads(ln[6:]) for ln in resp.iter_lines() if ln.startswith("data: {")]
    streamed = [
        (c["token"], c["logprob"]) for f in frames for c in (f["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert streamed == want
    plain = httpx.post(fleet.proxy + "/v1/chat/completions", json={**chat, "logprobs": False, "top_logprobs": None})
    assert plain.json()["choices"][0]["logprobs"] is None
    bad = httpx.post(fleet.proxy + "/v1/chat/completions", json={**chat, "top_logprobs": 21}, timeout=30)
    assert bad.status_code == 400 and "top_logprobs" in bad.text


def _pool_seen_everywhere(proxy: str, pool: str) -> bool:
    """Six fresh connections (spread over the processes by SO_REUSEPORT) all list the pool."""
    return all(pool in {m["id"] for m in httpx.get(proxy + "/v1/models").json()["data"]} for _ in range(6))


def _running(urls: list[str]) -> int:
    return sum(httpx.get(u + "/get_load").json()[0]["num_reqs"] for u in urls)


async def test_client_disconnect_aborts_the_engine_request(fleet: Fleet) -> None:
    body = {"input_ids": [3, 3], "sampling_params": LONG}
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(fleet.proxy + "/generate", json=body))
        await asyncio.to_thread(wait_until, lambda: _running(fleet.engines) == 1, 15, "the call to run")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await asyncio.to_thread(wait_until, lambda: _running(fleet.engines) == 0, 15, "the engine request to end")
    metrics = (await asyncio.to_thread(httpx.get, fleet.proxy + "/metrics")).text
    assert 'rollout_proxy_aborts_total{reason="disconnect"}' in metrics


def test_deadline_answers_upstream_timeout_and_aborts(fleet: Fleet) -> None:
    # paused engines keep the call waiting past the smallest deadline a caller may set (1 s)
    for url in fleet.engines:
        assert httpx.post(url + "/pause_generation", json={"mode": "in_place"}, timeout=10).status_code == 200
    try:
        resp = generate(fleet.proxy, {"input_ids": [4, 4], "sampling_params": LONG}, {h.HEADER_DEADLINE: "1"})
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "upstream_timeout" and resp.json()["error"]["infra"] is True
        wait_until(lambda: _running(fleet.engines) == 0, 15, "the aborted request to leave the engine")
    finally:
        for url in fleet.engines:
            httpx.post(url + "/continue_generation", json={}, timeout=10)


def test_drain_is_seen_by_every_process_and_rejoin(fleet: Fleet) -> None:
    victim = fleet.engines[0]
    victim_id = victim[len("http://") :]
    assert httpx.post(fleet.proxy + "/admin/engines/drain", json={"url": victim}).status_code == 200
    try:
        wait_until(lambda: all(engine_states(fleet.proxy)[victim_id]["state"] == "draining" for _ in range(6)))
        body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
        used = {generate(fleet.proxy, body).headers[h.HEADER_ENGINE] for _ in range(12)}
        assert victim_id not in used
    finally:
        rejoin = httpx.post(fleet.proxy + "/admin/engines", json={"url": victim, "pool": "default"})
    assert rejoin.status_code == 200
    wait_until(lambda: all(engine_states(fleet.proxy)[victim_id]["state"] == "active" for _ in range(6)))


async def test_unknown_fields_pass_through_untouched(fleet: Fleet, tmp_path: Path) -> None:
    """A tiny real echo engine (in this process) joins a pool; it returns the body it received."""
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"output_ids": [], "meta_info": {"id": body["rid"], "echo": body}})

    async def load(request: web.Request) -> web.Response:
        return web.json_response([{"num_reqs": 0}])

    app = web.Application()
    app.router.add_post("/generate", echo)
    app.router.add_get("/get_load", load)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(fleet.proxy + "/admin/engines", json={"url": url, "pool": "echo"}) as r:
                assert r.status == 200
            body = {"input_ids": [1, 2], "future_field": {"x": [1]}, "sampling_params": {"new_knob": 0.5}}
            await asyncio.to_thread(wait_until, lambda: _pool_seen_everywhere(fleet.proxy, "echo"), 15, "the pool")
            async with session.post(fleet.proxy + "/generate", json=body, headers={h.HEADER_POOL: "echo"}) as r:
                doc = await r.json()
            echoed = doc["meta_info"]["echo"]
            assert echoed["future_field"] == {"x": [1]} and echoed["sampling_params"]["new_knob"] == 0.5
            assert echoed["sampling_params"]["max_new_tokens"] == 200 and echoed["rid"] == doc["meta_info"]["id"]
            await session.post(fleet.proxy + "/admin/engines/remove", json={"url": url})
    finally:
        await runner.cleanup()


def test_lora_adapters_are_fanned_out_to_the_pool(fleet: Fleet) -> None:
    load = {"pool": "default", "action": "load", "lora_name": "job-b", "lora_path": "/adapters/job-b"}
    doc = httpx.post(fleet.proxy + "/admin/lora", json=load, timeout=30).json()
    assert doc["ok"] is True and len(doc["engines"]) == 3 and doc["adapters"] == {"job-b": "/adapters/job-b"}
    body = {"input_ids": [1, 2], "lora_path": "job-b", "sampling_params": {"max_new_tokens": 2}}
    assert {generate(fleet.proxy, body).status_code for _ in range(6)} == {200}  # every engine has it
    unknown = generate(fleet.proxy, {**body, "lora_path": "job-c"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "bad_request"
    unload = {"pool": "default", "action": "unload", "lora_name": "job-b"}
    assert httpx.post(fleet.proxy + "/admin/lora", json=unload, timeout=30).json()["adapters"] == {}
    assert generate(fleet.proxy, body).status_code == 400


def test_a_killed_proxy_worker_is_replaced(fleet: Fleet) -> None:
    pids = {httpx.get(fleet.proxy + "/healthz").json()["pid"] for _ in range(12)}
    assert len(pids) == 2  # two processes share the port (SO_REUSEPORT)
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: _fresh_pids(fleet.proxy) - (pids - {victim}) != set(), 30, "a new worker")
    body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
    assert {generate(fleet.proxy, body).status_code for _ in range(8)} == {200}


def _fresh_pids(proxy: str) -> set[int]:
    found = set()
    for _ in range(12):
        try:
            found.add(httpx.get(proxy + "/healthz", timeout=5).json()["pid"])
        except httpx.HTTPError:
            pass
    return found

"""``rollout bench turn``: the worker's CPU for one agent turn, split per component.

Everything a worker does between an LLM answer and the next LLM call, on the real code, in this
process: tokenizing the observation (a chat-template delta), decoding the reply, parsing the
action and building the observation, the ``/generate`` body (the whole context, as a worker sent
it before, and grown by the delta, as it sends it now), parsing the answer, the exec request and
result models, and the HTTP client's own CPU for the two calls of a turn (against a trivial
server in another process, so that only the client's CPU is counted). Redis is not on the turn
path (heartbeats and the final publish are per worker and per episode). Context sizes are the
tokens already in the episode when the turn starts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop
from aiohttp import web

from services.benchmarks.report import write_json
from services.protocol import SamplingParams
from services.protocol.sandboxes import ExecRequest, ExecResult
from services.rollout_api.worker.conversation import observation, parse_action
from services.rollout_api.worker.proxy_client import parse_generation, sampling_params
from services.rollout_api.worker.tokenization import _BEFORE, ChatTokenizer
from services.rollout_api.worker.tokens import TokenBuffer
from services.runtime.http_client import HttpClient
from services.runtime.net import free_port
from services.runtime.tables import print_table
from services.runtime.tokenizer import write_tokenizer_dir

REPLY = "THOUGHT: look at the failing test first.\n```bash\ngrep -rn 'def parse' src/ | head -50\n```"
OUTPUT = "src/parser.py:12:def parse(text):\n" * 40


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("turn", help="worker CPU per agent turn, split per component")
    p.add_argument("--contexts", default="2048,16384,65536", help="tokens in the episode at the turn")
    p.add_argument("--repeats", type=int, default=200, help="turns timed per component and context")
    p.add_argument("--json", type=Path, default=None)
    p.set_defaults(handler=run)


def _cpu_ms(action: Callable[[], object], repeats: int) -> float:
    started = time.process_time()
    for _ in range(repeats):
        action()
    return 1000 * (time.process_time() - started) / repeats


def components(tok: ChatTokenizer, context: int, repeats: int) -> dict[str, float]:
    """CPU ms per turn of each in-process component at one context size."""
    reply_ids = [*tok.encode(REPLY), tok.eos_id]
    answer = orjson.dumps({"output_ids": reply_ids, "meta_info": {
        "output_token_logprobs": [[-0.5, t, None] for t in reply_ids], "finish_reason": {"type": "stop"},
        "prompt_tokens": context, "weight_version": "v1", "engine_id": "e0"}})  # fmt: skip
    result = orjson.dumps({"exit_code": 0, "stdout": OUTPUT, "stderr": "", "timed_out": False, "duration_s": 0.01})
    sampling = SamplingParams()
    params = sampling_params(sampling)
    buffer = TokenBuffer()
    buffer.set_prompt(list(range(100, 100 + context)))
    message = {"role": "user", "content": OUTPUT}
    observed = tok.message_ids(message, reply_ended_with_eos=True)
    run = ExecResult.model_validate_json(result)
    return {
        "tokenize_observation": _cpu_ms(lambda: tok.message_ids(message, reply_ended_with_eos=True), repeats),
        "template_prefix_render_cut": _cpu_ms(lambda: tok.render(_BEFORE, False), repeats),
        "decode_reply": _cpu_ms(lambda: tok.decode(reply_ids), repeats),
        "parse_action_and_observation": _cpu_ms(lambda: observation(run, 10_000) and parse_action(REPLY), repeats),
        "generate_body_whole_context": _cpu_ms(
            lambda: orjson.dumps(
                {
                    "input_ids": buffer.context(),
                    "sampling_params": {**sampling.model_dump(), "max_new_tokens": 512},
                    "return_logprob": True,
                }
            ),
            repeats,
        ),  # fmt: skip
        "generate_body_delta": _cpu_ms(lambda: _delta_body(buffer, params, reply_ids + observed), repeats),
        "parse_answer": _cpu_ms(lambda: parse_generation(orjson.loads(answer), {}), repeats),
        "exec_models": _cpu_ms(
            lambda: (
                orjson.dumps(ExecRequest(shell="ls", timeout_s=120).model_dump(mode="json", exclude_none=True)),
                ExecResult.model_validate(orjson.loads(result)),
            ),
            repeats,
        ),  # fmt: skip
    }


def _delta_body(buffer: TokenBuffer, params: dict[str, Any], delta: list[int]) -> bytes:
    """What a worker now does per turn: encode the turn's new tokens, splice the encoded context
    into the body (the buffer is not grown, so every repeat sees the same context size)."""
    orjson.dumps(delta)
    rest = orjson.dumps({"sampling_params": {**params, "max_new_tokens": 512}, "return_logprob": True})
    return b'{"input_ids":' + buffer.context_json() + b"," + rest[1:]


def _serve(port: int) -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b'{"output_ids":[1],"meta_info":{}}', content_type="application/json")

    app = web.Application(client_max_size=1024**3)
    app.router.add_post("/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _http_ms(url: str, body: bytes, repeats: int) -> float:
    """The client's CPU for the two requests of a turn (generate with ``body``, then a small exec), with
    the worker's own client (``services.runtime.http_client``) on the worker's loop (uvloop)."""
    client = HttpClient(url)
    headers = {"Content-Type": "application/json"}
    for _ in range(5):  # warm the connection pool
        await client.request("POST", "/generate", body, headers)
    started = time.process_time()
    for _ in range(repeats):
        await client.request("POST", "/generate", body, headers)
        await client.request("POST", "/exec", b'{"shell":"ls"}', headers)
    used = 1000 * (time.process_time() - started) / repeats
    await client.close()
    return used


def run(args: argparse.Namespace) -> int:
    contexts = [int(c) for c in args.contexts.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-turn-") as tmp:
        tok = ChatTokenizer.from_dir(write_tokenizer_dir(Path(tmp) / "model"))
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        _wait_listening(port)
        rows = []
        for context in contexts:
            row: dict[str, Any] = {"context": context, **components(tok, context, args.repeats)}
            body = b'{"input_ids":' + orjson.dumps(list(range(context))) + b"}"
            row["http_client"] = uvloop.run(_http_ms(f"http://127.0.0.1:{port}", body, args.repeats))
            row["turn_before"] = _total(row, "generate_body_whole_context") + row["template_prefix_render_cut"]
            row["turn_now"] = _total(row, "generate_body_delta")
            rows.append(row)
    finally:
        server.terminate()
        server.join(5)
    print_table("worker CPU per agent turn (ms), by component and context size", rows)
    write_json(args.json, {"benchmark": "turn", "repeats": args.repeats, "rows": rows,
                           "turn_cpu_ms": {str(r["context"]): r["turn_now"] for r in rows}})  # fmt: skip
    return 0


def _wait_listening(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the trivial server did not listen on {port}")


def _total(row: dict[str, Any], body_key: str) -> float:
    skip = {"context", "generate_body_whole_context", "generate_body_delta", "template_prefix_render_cut",
            "turn_before", "turn_now"}  # fmt: skip
    return float(sum(v for k, v in row.items() if k not in skip) + row[body_key])

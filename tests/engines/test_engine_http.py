"""The simulated engine as a real process: SGLang's HTTP surface."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.runtime.net import free_port_range
from services.runtime.tokenizer import write_tokenizer_dir
from tests.support.processes import ServiceProcess, start_service

EOS = 258


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two sim engines from one process (``--count 2``), with the bundled tokenizer."""
    root = tmp_path_factory.mktemp("engine")
    tok = write_tokenizer_dir(root / "model")
    svc: ServiceProcess = start_service(
        ["-m", "services.cli", "engine", "--port", "{port}", "--count", "2", "--model-path", str(tok),
         "--output-tokens", "12", "--decode-step-s", "0.005", "--context-length", "4096", "--seed", "7"],
        log_dir=root / "logs", name="engine", port=free_port_range(2),
    )  # fmt: skip
    try:
        yield [svc.url, f"http://127.0.0.1:{svc.port + 1}"]
    finally:
        svc.stop()


def test_generate_with_ids_returns_sglang_meta_info(engines: list[str]) -> None:
    prompt = list(range(100, 120))
    body = {"input_ids": prompt, "return_logprob": True, "sampling_params": {"max_new_tokens": 64}}
    doc = httpx.post(engines[0] + "/generate", json=body, timeout=30).json()
    meta = doc["meta_info"]
    assert doc["output_ids"][-1] == EOS and meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert meta["prompt_tokens"] == 20 and meta["completion_tokens"] == len(doc["output_ids"])
    assert meta["weight_version"] == "default" and meta["cached_tokens"] == 0 and meta["id"]
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == doc["output_ids"] and all(t[0] < 0 and t[2] is None for t in triples)
    again = httpx.post(engines[0] + "/generate", json=body, timeout=30).json()
    assert again["output_ids"] == doc["output_ids"]  # deterministic given the seed
    assert again["meta_info"]["cached_tokens"] == 19  # the prompt was seen (its last token is recomputed)
    turn2 = {"input_ids": prompt + doc["output_ids"] + [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
    follow = httpx.post(engines[0] + "/generate", json=turn2, timeout=30).json()
    assert follow["meta_info"]["cached_tokens"] == 20 + len(doc["output_ids"])  # multi-turn prefix reuse


def test_max_new_tokens_cuts_with_length_and_text_is_accepted(engines: list[str]) -> None:
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    doc = httpx.post(engines[1] + "/generate", json=body, timeout=30).json()
    assert doc["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert len(doc["output_ids"]) == 3 and isinstance(doc["text"], str)


def test_context_length_errors_use_sglang_messages(engines: list[str]) -> None:
    too_long = httpx.post(engines[0] + "/generate", json={"input_ids": [1] * 4096}, timeout=30)
    assert too_long.status_code == 400
    assert "is longer than the model's context length (4096 tokens)" in too_long.json()["error"]["message"]
    body = {"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 4000}}
    over = httpx.post(engines[0] + "/generate", json=body, timeout=30)
    assert over.status_code == 400
    assert "Requested token count exceeds the model's maximum context length" in over.json()["error"]["message"]


def test_streaming_sends_frames_and_done(engines: list[str]) -> None:
    body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    frames = []
    with httpx.stream("POST", engines[0] + "/generate", json=body, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]" and len(frames) >= 3
    last = json.loads(frames[-2])
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 5} and len(last["output_ids"]) == 5


def test_abort_by_prefix_and_flush_cache_refused_while_running(engines: list[str]) -> None:
    url = engines[1]
    body = {
        "input_ids": [1, 2],
        "rid": "traj-1-turn-3",
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
    }
    result: dict[str, object] = {}
    caller = threading.Thread(target=lambda: result.update(httpx.post(url + "/generate", json=body, timeout=60).json()))
    caller.start()
    _wait_running(url)
    assert httpx.post(url + "/flush_cache", timeout=10).status_code == 400
    assert httpx.post(url + "/abort_request", json={"rid": "traj-1-"}, timeout=10).status_code == 200
    caller.join(timeout=30)
    meta = result["meta_info"]
    assert isinstance(meta, dict) and meta["finish_reason"]["type"] == "abort"
    assert httpx.post(url + "/flush_cache", timeout=10).status_code == 200


def test_pause_retract_then_continue_finishes_the_request(engines: list[str]) -> None:
    url = engines[0]
    body = {"input_ids": [9, 9], "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
    result: dict[str, object] = {}
    caller = threading.Thread(target=lambda: result.update(httpx.post(url + "/generate", json=body, timeout=60).json()))
    caller.start()
    _wait_running(url)
    paused = httpx.post(url + "/pause_generation", json={"mode": "retract"}, timeout=10).json()
    assert paused["status"] == "ok"
    load = httpx.get(url + "/get_load", timeout=10).json()[0]
    assert load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 1
    assert httpx.post(url + "/flush_cache", timeout=10).status_code == 400  # still waiting
    httpx.post(url + "/continue_generation", json={}, timeout=10)
    caller.join(timeout=30)
    meta = result["meta_info"]
    assert isinstance(meta, dict) and meta["completion_tokens"] == 200 and meta["num_retractions"] == 1


def test_update_weights_sets_version_and_bad_path_fails(engines: list[str], tmp_path: Path) -> None:
    url = engines[1]
    ok = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "v2"})
    assert ok.status_code == 200 and ok.json()["success"] is True
    info = httpx.get(url + "/get_model_info").json()
    assert info["weight_version"] == "v2" and info["is_generation"] is True
    meta = httpx.post(url + "/generate", json={"input_ids": [5], "sampling_params": {"max_new_tokens": 2}}).json()
    assert meta["meta_info"]["weight_version"] == "v2"
    bad = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")})
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert httpx.get(url + "/get_model_info").json()["weight_version"] == "v2"


def test_count_serves_distinct_engines_and_control_routes(engines: list[str]) -> None:
    ids = [httpx.get(u + "/get_server_info").json()["engine_id"] for u in engines]
    assert len(set(ids)) == 2 and all(i.startswith("engine-") for i in ids)
    for path in ("/health", "/health_generate", "/healthz", "/get_load", "/v1/models"):
        assert httpx.get(engines[0] + path, timeout=30).status_code == 200, path
    text = httpx.get(engines[0] + "/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput"):
        assert name in text


def test_openai_chat_completion(engines: list[str]) -> None:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    doc = httpx.post(engines[0] + "/v1/chat/completions", json=body, timeout=30).json()
    assert doc["object"] == "chat.completion" and doc["choices"][0]["message"]["role"] == "assistant"
    assert doc["usage"]["completion_tokens"] <= 4 and doc["metadata"]["weight_version"]


def _wait_running(url: str) -> None:
    with httpx.Client(timeout=10) as client:
        for _ in range(500):
            if client.get(url + "/get_load").json()[0]["num_running_reqs"] > 0:
                return
            threading.Event().wait(0.01)
    raise AssertionError("the request never started running")


def test_scripted_mode_answers_from_the_script(tmp_path: Path) -> None:
    from services.engines.tokenization import TextCodec, render_chat

    script = {"rules": [{"match": "fix the bug", "replies": ["ls -la", {"text": "submit", "latency_s": 0.1}]}]}
    path = tmp_path / "script.json"
    path.write_text(json.dumps({**script, "default": "?"}))
    svc = start_service(
        ["-m", "services.cli", "engine", "--mode", "scripted", "--script", str(path), "--port", "{port}"],
        log_dir=tmp_path / "logs", name="scripted",
    )  # fmt: skip
    try:
        codec = TextCodec.bundled()
        first = codec.encode(render_chat([{"role": "user", "content": "please fix the bug"}]))
        body = {"input_ids": first, "return_logprob": True, "sampling_params": {"max_new_tokens": 100}}
        doc = httpx.post(svc.url + "/generate", json=body, timeout=30).json()
        assert codec.decode(doc["output_ids"]) == "ls -la<|im_end|>" and doc["output_ids"][-1] == EOS
        assert doc["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
        assert all(t[0] < 0 for t in doc["meta_info"]["output_token_logprobs"])
        turns: list[dict[str, object]] = [
            {"role": "user", "content": "fix the bug"},
            {"role": "assistant", "content": "ls -la"},
        ]
        second = codec.encode(render_chat([*turns, {"role": "user", "content": "a.py"}]))
        cut = httpx.post(svc.url + "/generate", json={"input_ids": second, "sampling_params": {"max_new_tokens": 3}})
        assert codec.decode(cut.json()["output_ids"]) == "sub"
        assert cut.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    finally:
        svc.stop()

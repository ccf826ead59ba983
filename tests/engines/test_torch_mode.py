"""``rollout engine --mode torch``: a real tiny model behind SGLang's API, logprobs included."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.runtime.tokenizer import VOCAB_SIZE, write_tokenizer_dir
from tests.support.processes import start_service

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a loaded machine starts torch engines slowly


def tiny_model(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=258, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return write_tokenizer_dir(path)


def full_forward_logprobs(model_dir: Path, ids: list[int], prompt_len: int) -> list[float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return [float(lp[prompt_len - 1 + i, tok]) for i, tok in enumerate(ids[prompt_len:])]


def test_generates_with_the_models_logprobs_and_reloads_weights(tmp_path: Path, service_logs: Path) -> None:
    first, second = tiny_model(tmp_path / "v0", 0), tiny_model(tmp_path / "v1", 1)
    engine = start_service(
        ["-m", "services.cli", "engine", "--mode", "torch", "--model-path", str(first), "--port", "{port}",
         "--decode-step-s", "0", "--decode-step-per-request-s", "0", "--context-length", "256"],
        log_dir=service_logs, health_path="/health", name="torch-engine", timeout_s=180,
    )  # fmt: skip
    prompt = list(b"hello")
    body = {"input_ids": prompt, "return_logprob": True, "sampling_params": {"max_new_tokens": 12}}
    try:
        with httpx.Client(base_url=engine.url, timeout=60) as client:
            out = client.post("/generate", json=body).json()
            ids = out["output_ids"]
            got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
            assert [tok for _, tok, _ in out["meta_info"]["output_token_logprobs"]] == ids
            want = full_forward_logprobs(first, prompt + ids, len(prompt))
            assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got, want, strict=True))
            concurrent_calls_are_batched_without_changing_logprobs(client, first)
            greedy = {**body, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
            before = client.post("/generate", json=greedy).json()["output_ids"]
            update = client.post("/update_weights_from_disk", json={"model_path": str(second), "weight_version": "1"})
            assert update.status_code == 200 and update.json()["success"], update.text
            after = client.post("/generate", json=greedy).json()
            assert after["meta_info"]["weight_version"] == "1"
            want_after = full_forward_logprobs(second, prompt + after["output_ids"], len(prompt))
            got_after = [lp for lp, _, _ in after["meta_info"]["output_token_logprobs"]]
            assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got_after, want_after, strict=True))
            assert before != after["output_ids"] or got_after != got
            assert seeded(client, prompt, 3) == seeded(client, prompt, 3) != seeded(client, prompt, 4)
    finally:
        engine.stop()


def concurrent_calls_are_batched_without_changing_logprobs(client: httpx.Client, model_dir: Path) -> None:
    """Calls of different prompt lengths decoded together (left-padded): each one's logprobs are still
    those of a forward pass over its own sequence alone, and each stops at its own budget."""
    prompts = [list(b"hi"), list(b"a much longer prompt than the others"), list(b"mid length"), list(b"x")]
    budgets = [5, 9, 12, 7]

    def call(i: int) -> dict[str, Any]:
        body = {"input_ids": prompts[i], "return_logprob": True, "sampling_params": {"max_new_tokens": budgets[i]}}
        out: dict[str, Any] = client.post("/generate", json=body).json()
        return out

    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(call, range(len(prompts))))
    for prompt, budget, out in zip(prompts, budgets, outs, strict=True):
        ids = out["output_ids"]
        assert 1 <= len(ids) <= budget
        got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        want = full_forward_logprobs(model_dir, prompt + ids, len(prompt))
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got, want, strict=True))


def seeded(client: httpx.Client, prompt: list[int], seed: int) -> list[int]:
    """Sampled at temperature 1 with SGLang's ``sampling_seed`` (what evaluation rollouts send)."""
    params = {"max_new_tokens": 16, "temperature": 1.0, "sampling_seed": seed}
    answer = client.post("/generate", json={"input_ids": prompt, "sampling_params": params})
    ids: list[int] = answer.json()["output_ids"]
    return ids

"""The engines serve the trainer's new weights after each update: a Megatron model is exported,
announced through the real proxy's weight transaction (``WeightPublisher``) to a real ``torch``
engine, and the logprobs the engine serves for a fixed token sequence (SGLang's
``input_token_logprobs``) change with every update and equal the trainer's own for that version."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest
import torch

from rollout_client.weights import WeightPublisher
from tests.llm_proxy.fleet import start_proxy
from tests.support.processes import start_service
from tests.trainer.conftest import TINY
from trainer_client.export import Export, export_hf
from trainer_client.model import ModelConfig, ParallelConfig, build_gpt, init_parallel, token_logprobs

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(600)]

IDS = [*b"fixed tokens, served by every version", 7, 250, 3]
TOLERANCE = 1e-3  # nats per token: float32 Megatron vs transformers on the same weights (measured ~1e-5)


def trainer_logprobs(model: torch.nn.Module) -> list[float]:
    """log p(token t | tokens < t) under the trainer's model, for t = 1..len(IDS)-1."""
    ids = torch.tensor([IDS])
    with torch.no_grad():
        return token_logprobs(model.eval(), ids[:, :-1], ids[:, 1:])[0].tolist()


def served_logprobs(proxy_url: str) -> tuple[str, list[float]]:
    """The weight version that answered and its logprobs of the same tokens, through the proxy."""
    body = {"input_ids": IDS, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip
    meta = httpx.post(proxy_url + "/generate", json=body, timeout=120).json()["meta_info"]
    first, *rest = meta["input_token_logprobs"]
    assert first[0] is None and [tok for _, tok, _ in rest] == IDS[1:]
    return str(meta["weight_version"]), [float(lp) for lp, _, _ in rest]


def new_weights(model: torch.nn.Module, cfg: ModelConfig, version: str, root: Path, tokenizer: Path) -> Export:
    """An update of every parameter (as an optimizer step would), exported as ``version``."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return export_hf(model.state_dict(), cfg, version, root, tokenizer)


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_engine_serves_each_update_with_the_trainers_logprobs(
    tmp_path: Path, tokenizer_dir: Path, redis_url: str, service_logs: Path
) -> None:
    cfg = ModelConfig(**TINY, seed=5)
    init_parallel(ParallelConfig(), cfg.seed)
    model = build_gpt(cfg, ParallelConfig())
    first = new_weights(model, cfg, "0", tmp_path / "exports", tokenizer_dir)
    with contextlib.ExitStack() as stack:
        engine = start_service(
            ["-m", "services.cli", "engine", "--mode", "torch", "--model-path", str(first.path), "--port", "{port}",
             "--weight-version", "0", "--decode-step-s", "0", "--decode-step-per-request-s", "0",
             "--context-length", "128"],
            log_dir=service_logs, health_path="/health", name="torch-engine", timeout_s=180,
        )  # fmt: skip
        stack.callback(engine.stop)
        proxy = start_proxy(service_logs, redis_url, [engine.url], "--workers", "1", timeout_s=180)
        stack.callback(proxy.stop)
        publisher = stack.enter_context(contextlib.closing(WeightPublisher(proxy.url, pool="default", timeout_s=300)))
        version, served = served_logprobs(proxy.url)
        assert version == "0" and gap(served, trainer_logprobs(model)) < TOLERANCE
        for update in ("1", "2"):
            outcome = publisher.publish(new_weights(model, cfg, update, tmp_path / "exports", tokenizer_dir))
            assert outcome.ok, outcome
            before, (version, served) = served, served_logprobs(proxy.url)
            assert version == update
            assert gap(served, before) > 0.05  # the update reached the engine...
            assert gap(served, trainer_logprobs(model)) < TOLERANCE  # ...and it is the trainer's

"""The torch engine's lean Llama forward: the same logits as transformers' forward, on a left-padded
batch and through its cache; any config it does not implement stays on transformers' forward."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from services.engines.lean_llama import LeanLlama  # noqa: E402  (torch first)
from services.engines.torch_model import TorchPolicy, _Request  # noqa: E402
from services.runtime.tokenizer import VOCAB_SIZE, write_tokenizer_dir  # noqa: E402


def llama(seed: int = 0, **overrides: Any) -> Any:
    """A tiny Llama (grouped-query attention, head dim 8) with weights far from their initialisation,
    so that every part of the forward moves the logits."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{
        "vocab_size": VOCAB_SIZE, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "tie_word_embeddings": False, **overrides,
    })  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model


def left_padded(lengths: list[int], pad: int) -> tuple[Any, Any, Any]:
    rng = random.Random(sum(lengths))
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.tensor([rng.randrange(256) for _ in range(n)])
        mask[row, width - n :] = True
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("tied", [False, True])
def test_the_lean_forward_gives_transformers_logits_for_padded_rows_and_through_its_cache(tied: bool) -> None:
    model = llama(tie_word_embeddings=tied)
    lean = LeanLlama.of(model)
    assert lean is not None
    ids, mask, positions = left_padded([7, 19, 12], pad=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, use_cache=True)
        logits, cache = lean.forward(ids, positions, mask, None)
        assert torch.allclose(logits, out.logits[:, -1], atol=1e-4), (logits - out.logits[:, -1]).abs().max()
        for _ in range(12):  # each row's greedy token, fed to both
            step = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones((3, 1), dtype=torch.bool)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=step, attention_mask=mask.long(), position_ids=positions,
                        cache=out.cache, use_cache=True)  # fmt: skip
            logits, cache = lean.forward(step, positions, mask, cache)
            assert torch.allclose(logits, out.logits[:, -1], atol=1e-4), (logits - out.logits[:, -1]).abs().max()
    assert logits.abs().max() > 1  # logits that differ between tokens, not a degenerate model


@pytest.mark.parametrize(
    "overrides",
    [{"attention_bias": True}, {"mlp_bias": True}, {"hidden_act": "gelu"},
     {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}],
)  # fmt: skip
def test_a_config_the_lean_forward_does_not_implement_stays_on_transformers(overrides: dict[str, Any]) -> None:
    assert LeanLlama.of(llama(**overrides)) is None


def test_the_policy_decodes_the_same_tokens_and_logprobs_with_either_forward(tmp_path: Path) -> None:
    llama(seed=3, eos_token_id=258).save_pretrained(tmp_path)
    write_tokenizer_dir(tmp_path)
    policy = TorchPolicy(tmp_path)
    assert policy.lean is not None

    def decode() -> list[tuple[list[int], list[float]]]:
        rng = random.Random(5)
        batch = [_Request([rng.randrange(256) for _ in range(n)], 16, temperature, 1.0, set(),
                          torch.Generator().manual_seed(row))
                 for row, (n, temperature) in enumerate([(5, 0.0), (23, 1.0), (11, 0.7)])]  # fmt: skip
        return [(s.output_ids, s.logprobs) for s in policy._decode(batch)]

    lean = decode()
    policy.lean = None  # transformers' forward
    full = decode()
    assert [ids for ids, _ in lean] == [ids for ids, _ in full]
    for (_, a), (_, b) in zip(lean, full, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    assert len({tuple(ids) for ids, _ in lean}) == 3

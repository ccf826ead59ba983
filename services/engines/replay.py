"""Per-token extras beyond logprobs that SGLang returns on request: ``output_top_logprobs``
(``top_logprobs_num``) and the MoE routing replay (``return_routed_experts``).

The stand-in has no experts; it routes token ``t`` at layer ``l`` to experts
``(t * (l + 1) + k) % num_experts`` for ``k < topk``, so a test can check that every row of the
replay belongs to the right token. Like SGLang, the payload is base64 of an int32 array of shape
``(len(prompt + output) - 1, layers, topk)``: it covers the prompt too.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from services.engines.settings import EngineSettings


def routed_expert(token: int, layer: int, k: int, num_experts: int) -> int:
    return (token * (layer + 1) + k) % num_experts


def routed_experts(settings: EngineSettings, tokens: Sequence[int]) -> str:
    layers, topk, experts = settings.moe_layers, settings.moe_topk, settings.moe_experts
    values = array("i", (routed_expert(t, layer, k, experts) for t in tokens[:-1] for layer in range(layers)
                         for k in range(topk)))  # fmt: skip
    if sys.byteorder != "little":
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode()


def top_logprobs(meta: dict[str, Any], top_n: int, vocab_size: int) -> list[list[list[Any]]]:
    """The sampled token first, then ``top_n - 1`` less likely stand-ins."""
    out = []
    for logprob, token, _ in meta.get("output_token_logprobs") or []:
        alternates = [[round(logprob - 1.0 - j, 6), (token + j + 1) % vocab_size, None] for j in range(top_n - 1)]
        out.append([[logprob, token, None], *alternates])
    return out


def add_replay_fields(
    settings: EngineSettings, body: dict[str, Any], meta: dict[str, Any], prompt_ids: Sequence[int], out: list[int]
) -> None:
    top_n = int(body.get("top_logprobs_num") or 0)
    if top_n > 0 and "output_token_logprobs" in meta:
        meta["output_top_logprobs"] = top_logprobs(meta, top_n, settings.vocab_size)
    if body.get("return_routed_experts"):
        meta["routed_experts"] = routed_experts(settings, [*prompt_ids, *out])

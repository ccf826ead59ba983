"""A Llama decoder's forward in plain torch ops, for the torch engine's sampling loop.

The engine's models are tiny (the demo's: 2 layers, 64 wide). For them transformers' forward is
nearly all Python: modules, cache objects, mask builders and config lookups, about 1.8 ms of CPU
per token at one row, where the arithmetic is a few hundred microseconds. This runs the same
computation (RMSNorm, rotary embedding, grouped-query attention through ``scaled_dot_product_attention``,
SiLU-gated MLP) on the checkpoint's own weight tensors, with a plain per-layer key/value cache.
:func:`LeanLlama.of` takes a model only when its config is one this implements exactly (a Llama with
the default rotary embedding, no biases, SiLU); any other stays on transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (rows, kv heads, positions, head dim)


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # the query, key and value projections stacked: one matmul
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # the MLP's gate and up projections stacked
    down: torch.Tensor


class LeanLlama:
    """Logits of the last position of each row, given the new tokens, their positions and a key
    padding mask over every position so far (the cache's and the new ones)."""

    def __init__(self, model: Any) -> None:  # a transformers LlamaForCausalLM
        config = model.config
        inner = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.layers = [
            _Layer(
                layer.input_layernorm.weight,
                torch.cat(
                    (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight)
                ),
                layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight,
                torch.cat((layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)),
                layer.mlp.down_proj.weight,
            )  # fmt: skip
            for layer in inner.layers
        ]
        self.split_qkv = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        self.ffn = int(config.intermediate_size)
        self.inv_freq = inner.rotary_emb.inv_freq.float()

    @classmethod
    def of(cls, model: Any) -> LeanLlama | None:
        """A lean forward for ``model``, or None where its config has anything this does not implement."""
        config = model.config
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        supported = (
            getattr(config, "model_type", None) == "llama"
            and type(model).__name__ == "LlamaForCausalLM"
            and getattr(config, "hidden_act", None) == "silu"
            and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False)
            and getattr(config, "pretraining_tp", 1) == 1
            and rope.get("rope_type", "default") == "default"
            and float(getattr(model.model.rotary_emb, "attention_scaling", 1.0)) == 1.0
        )
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # every dimension of a head rotated (no partial rotary factor)
        supported = supported and 2 * model.model.rotary_emb.inv_freq.numel() == head_dim
        return cls(model) if supported else None

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, KVCache]:
        """``ids`` and ``positions``: (rows, new); ``keep``: (rows, cached + new), True where a key is a
        real token. Returns the last position's logits (rows, vocab) and the grown cache."""
        rows, new = ids.shape
        x = F.embedding(ids, self.embed)
        freqs = positions.unsqueeze(-1).float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # (rows, 1, new, head dim)
        cos, sin = angles.cos(), angles.sin()
        total = keep.shape[1]
        mask = keep[:, None, None, :]  # (rows, 1, 1 or new, total)
        if new > 1:  # causal over the new tokens (a padding query masked everywhere gets zeros from sdpa, not NaN)
            mask = mask & torch.ones((new, total), dtype=torch.bool).tril(total - new)
        grown: KVCache = []
        half = self.head_dim // 2
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer.input_norm)
            q, k, v = torch.split(F.linear(h, layer.qkv), self.split_qkv, dim=-1)
            q = q.reshape(rows, new, self.heads, self.head_dim).transpose(1, 2)
            k = k.reshape(rows, new, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.reshape(rows, new, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            if cache is not None:
                k, v = torch.cat((cache[i][0], k), dim=2), torch.cat((cache[i][1], v), dim=2)
            grown.append((k, v))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
            x = x + F.linear(att.transpose(1, 2).reshape(rows, new, -1), layer.o)
            h = self._rms(x, layer.post_norm)
            gate, up = torch.split(F.linear(h, layer.gate_up), self.ffn, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        return F.linear(self._rms(x[:, -1], self.norm), self.lm_head), grown

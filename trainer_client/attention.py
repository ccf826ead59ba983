"""Core attention of the policy: packed rows attend per sequence, so packing never costs more than padding.

A packed micro-batch is one row of several whole sequences in Megatron's ``thd`` layout: the row's
segment boundaries travel as :class:`~megatron.core.packed_seq_params.PackedSeqParams`
(``cu_seqlens``), Megatron applies rotary embeddings per segment (positions restart at 0 in every
sequence, as if it were alone) and hands the core attention ``[t, heads, head_dim]`` tensors.

- With Transformer Engine on a CUDA host, the core attention is Megatron's own
  ``TEDotProductAttention`` (its varlen kernels read ``cu_seqlens``): the GPU path of packed
  sequences as Megatron runs it (``parallel.attention``: ``auto``, or ``te`` to insist).
- Otherwise (CPU hosts, GPUs without TE, or ``parallel.attention="sdpa"``) it is
  :class:`SegmentAttention`: causal attention computed segment by segment with
  ``torch.nn.functional.scaled_dot_product_attention``. Its cost is the sum of the squared
  sequence lengths, never the square of the row; no ``[L, L]`` mask is built.

Unpacked rows (``sbhd``, no ``PackedSeqParams``) go through the same SDPA call: causal when no mask
is given, else with the boolean mask (True = forbidden, Megatron's convention).
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention


class SegmentAttention(DotProductAttention):  # type: ignore[misc]
    """Megatron's ``DotProductAttention`` interface (same constructor, heads split per tensor-parallel
    rank, same softmax scale) with SDPA inside and support for the ``thd`` packed layout."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        if attention_bias is not None or self.softmax_offset is not None:
            raise ValueError("SegmentAttention supports neither attention bias nor softmax offsets")
        if packed_seq_params is None:
            return self._rows(query, key, value, attention_mask)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed sequences must use the thd layout, not {packed_seq_params.qkv_format!r}")
        return self._segments(query, key, value, packed_seq_params.cu_seqlens_q)

    def _rows(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``[s, b, heads, d]`` in, ``[s, b, heads * d]`` out."""
        s, b = query.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        out = self._sdpa(q, k, v, None if mask is None else ~mask)
        return out.permute(2, 0, 1, 3).reshape(s, b, self.hidden_size_per_partition)

    def _segments(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """``[t, heads, d]`` in, ``[t, heads * d]`` out; each ``cu_seqlens`` segment attends causally to itself."""
        bounds = cu_seqlens.tolist()
        parts = []
        for start, end in itertools.pairwise(bounds):
            q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))  # [1, heads, l, d]
            parts.append(self._sdpa(q, k, v, None)[0].transpose(0, 1))
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out.reshape(out.shape[0], self.hidden_size_per_partition)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """Causal (``allowed`` None) or masked attention; key/value groups shared by consecutive query heads."""
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        dropout = self.attention_dropout.p if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=dropout, is_causal=allowed is None, scale=self.softmax_scale
        )


def core_attention(choice: str = "auto") -> type:
    """``te``: Megatron's ``TEDotProductAttention`` (needs CUDA and Transformer Engine); ``sdpa``:
    :class:`SegmentAttention`; ``auto``: the first where it can run, else the second."""
    te_here = torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None
    if choice == "te" and not te_here:
        raise ValueError("parallel.attention='te' needs a CUDA host with transformer_engine installed")
    if choice == "te" or (choice == "auto" and te_here):
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        return TEDotProductAttention  # type: ignore[no-any-return]
    return SegmentAttention


def packed_params(cu_seqlens: torch.Tensor) -> PackedSeqParams:
    """``thd`` parameters of one packed row (``cu_seqlens``: int32 segment boundaries, 0 first)."""
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )

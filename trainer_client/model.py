"""The policy: a Megatron-core ``GPTModel`` in Llama/Qwen style, its parallel state and optimizer.

RMSNorm, SwiGLU, rotary position embeddings, no biases, grouped-query attention, tied or untied
embeddings. The same code runs on GPUs (NCCL, tensor/pipeline parallel sizes from the settings)
and on CPU-only hosts (gloo, world size 1, with :mod:`trainer_client.cpu_shims`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainer_client.cpu_shims import apply_cpu_shims, megatron_on_cpu

logger = logging.getLogger(__name__)


Family = Literal["llama", "qwen2", "qwen3"]


class ModelConfig(BaseModel):
    """Architecture of the policy; ``family`` picks the HF naming and the small differences
    (Qwen2: q/k/v biases; Qwen3: q/k RMSNorm per head), see :mod:`trainer_client.hf_map`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Family = "llama"
    vocab_size: int = Field(259, ge=2)
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_query_groups: int = Field(2, ge=1)  # GQA: key/value heads
    kv_channels: int | None = Field(None, ge=1)  # head dimension when not hidden / heads (Qwen3)
    ffn_hidden_size: int = Field(128, ge=8)
    max_position_embeddings: int = Field(512, ge=8)
    rope_theta: float = Field(10_000.0, gt=0)
    norm_epsilon: float = Field(1e-6, gt=0)
    tie_embeddings: bool = False
    init_std: float = Field(0.02, gt=0)
    seed: int = 1234

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads


class ParallelConfig(BaseModel):
    """Megatron model parallelism; data parallelism is what remains of the world size
    (``WORLD_SIZE / tensor_parallel``). Pipeline stages are refused (see :func:`_no_pipeline`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    recompute_activations: bool = False  # full recompute of every layer in the backward pass
    # core attention: auto = Transformer Engine's on CUDA hosts that have it, else SDPA per sequence
    attention: Literal["auto", "sdpa", "te"] = "auto"

    @field_validator("pipeline_parallel")
    @classmethod
    def _no_pipeline(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                "pipeline_parallel > 1 is not supported: the GRPO loop computes per-token logprobs on the last "
                "stage and would need Megatron's pipeline schedule (forward_backward_pipelining) with the loss "
                "inside it; use tensor_parallel and data parallelism (more ranks) instead"
            )
        return value


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    clip_grad: float = Field(1.0, ge=0)  # 0 disables clipping
    warmup_steps: int = Field(0, ge=0)  # linear warm-up from lr / (warmup_steps + 1) to lr
    decay: Literal["constant", "cosine"] = "constant"  # after warm-up
    decay_steps: int = Field(1000, ge=1)  # cosine: steps after warm-up to reach min_lr
    min_lr: float = Field(0.0, ge=0)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (1-based), a pure function: a resumed run continues it."""
        if step <= self.warmup_steps:
            return self.lr * step / (self.warmup_steps + 1)
        if self.decay == "constant":
            return self.lr
        done = min(1.0, (step - self.warmup_steps) / self.decay_steps)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * done))


@dataclass
class Policy:
    """The Megatron model (wrapped in Megatron DDP) and its optimizer."""

    config: ModelConfig
    ddp: Any  # megatron.core.distributed.DistributedDataParallel
    optimizer: Any  # megatron.core.optimizer.MegatronOptimizer

    @property
    def module(self) -> Any:
        """The bare GPTModel."""
        return self.ddp.module


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def init_parallel(parallel: ParallelConfig, seed: int) -> None:
    """Start torch.distributed (NCCL with GPUs, else gloo) and Megatron's parallel state, once."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    apply_cpu_shims()
    if not dist.is_initialized():
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        # under torchrun the env:// rendezvous; alone, a private loopback port (never written to
        # os.environ, so child processes do not inherit a port this process holds)
        init = "env://" if "MASTER_ADDR" in os.environ else f"tcp://127.0.0.1:{free_port()}"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(parallel.tensor_parallel, parallel.pipeline_parallel)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def transformer_config(cfg: ModelConfig, parallel: ParallelConfig) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.ffn_hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        kv_channels=cfg.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=cfg.family == "qwen2",
        qk_layernorm=cfg.family == "qwen3",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=cfg.init_std,
        use_cpu_initialization=not torch.cuda.is_available(),
        params_dtype=torch.float32,
        calculate_per_token_loss=True,  # the loss is pre-divided by the step's token count: DDP sums over ranks
        recompute_granularity="full" if parallel.recompute_activations else None,
        recompute_method="uniform" if parallel.recompute_activations else None,
        recompute_num_layers=1 if parallel.recompute_activations else None,
        tensor_model_parallel_size=parallel.tensor_parallel,
        pipeline_model_parallel_size=parallel.pipeline_parallel,
    )


def build_gpt(cfg: ModelConfig, parallel: ParallelConfig) -> Any:
    """A bare GPTModel (call :func:`init_parallel` first); core attention from :mod:`trainer_client.attention`."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from trainer_client.attention import core_attention

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=cfg.family == "qwen3")
    spec.submodules.self_attention.submodules.core_attention = core_attention(parallel.attention)
    model = GPTModel(
        config=transformer_config(cfg, parallel),
        transformer_layer_spec=spec,
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=int(cfg.rope_theta),
        share_embeddings_and_output_weights=cfg.tie_embeddings,
    )
    return model.to(device())


def build_policy(cfg: ModelConfig, parallel: ParallelConfig, optim: OptimConfig) -> Policy:
    """GPTModel in Megatron DDP with Megatron's Adam optimizer."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    init_parallel(parallel, cfg.seed)
    model = build_gpt(cfg, parallel)
    with megatron_on_cpu():
        ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.adam_beta1,
        adam_beta2=optim.adam_beta2,
        clip_grad=optim.clip_grad,
    )
    with megatron_on_cpu():
        optimizer = get_megatron_optimizer(opt_config, [ddp])
    return Policy(config=cfg, ddp=ddp, optimizer=optimizer)


def token_logprobs(
    model: Any, input_ids: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> torch.Tensor:
    """log p(labels[b, t] | input_ids[b, :t+1]) for every position, shape [B, L] (tensor-parallel safe).

    Causal rows by default; ``cu_seqlens`` (int32 segment boundaries of one packed row, ``B == 1``)
    makes every segment a sequence of its own (Megatron's ``thd`` packed layout, see
    :mod:`trainer_client.attention`).
    """
    from trainer_client.attention import packed_params

    length = input_ids.shape[1]
    positions = torch.arange(length, device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    packed = None if cu_seqlens is None else packed_params(cu_seqlens)
    losses = model(input_ids, positions, None, labels=labels, packed_seq_params=packed)
    out: torch.Tensor = -losses.float()
    return out


def logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Full logits [B, L, V] (world size 1: vocab not split)."""
    length = input_ids.shape[1]
    positions = torch.arange(length, device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    out: torch.Tensor = model(input_ids, positions, None).float()
    return out

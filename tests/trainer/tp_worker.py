"""One rank of a tensor-parallel (TP=2, gloo, CPU) model: gathers logits and weights, rank 0 exports,
then a fresh TP model loads the export back (each rank its slice); for each model family.

Run by ``test_export.py`` as two real processes (``RANK``/``WORLD_SIZE``/``MASTER_*`` set):
``python -m tests.trainer.tp_worker OUT_DIR TOKENIZER_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from tests.trainer.conftest import TINY
from trainer_client.export import export_hf
from trainer_client.hf_import import load_hf_weights
from trainer_client.model import ModelConfig, ParallelConfig, build_gpt, init_parallel, logits
from trainer_client.shards import full_state_dict

IDS = [[72, 101, 108, 108, 111, 44, 32, 84, 80, 33, 258]]


FAMILIES: list[dict[str, Any]] = [{"family": "llama"}, {"family": "qwen2"}, {"family": "qwen3", "kv_channels": 16}]


def main(out: Path, tokenizer_dir: Path) -> None:
    init_parallel(ParallelConfig(tensor_parallel=2), 5)
    for extra in FAMILIES:
        cfg = ModelConfig(**{**TINY, "vocab_size": 260}, **extra, seed=5)  # the vocabulary splits evenly over 2 ranks
        one_family(cfg, out / cfg.family, tokenizer_dir)


def one_family(cfg: ModelConfig, out: Path, tokenizer_dir: Path) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    parallel = ParallelConfig(tensor_parallel=2)
    out.mkdir(parents=True, exist_ok=True)
    model = build_gpt(cfg, parallel)
    rank = parallel_state.get_tensor_model_parallel_rank()
    torch.manual_seed(100)  # same on both ranks: replicated norms must stay identical
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        full = gather_from_tensor_model_parallel_region(logits(model.eval(), torch.tensor(IDS)))
    state = full_state_dict(model)
    if rank == 0:
        export = export_hf(state, cfg, "1", out / "exports", tokenizer_dir)
        torch.save(full, out / "megatron_logits.pt")
        (out / "export.json").write_text(json.dumps({"path": str(export.path), "ids": IDS}))
    torch.distributed.barrier()
    fresh = build_gpt(cfg.model_copy(update={"seed": 9}), parallel)
    load_hf_weights(fresh, out / "exports" / "v1", cfg)
    with torch.no_grad():
        reloaded = gather_from_tensor_model_parallel_region(logits(fresh.eval(), torch.tensor(IDS)))
    if rank == 0:
        torch.save(reloaded, out / "reloaded_logits.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

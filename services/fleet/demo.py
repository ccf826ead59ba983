"""The demo's files: the initial (untrained) policy, the train / held-out task files and the SFT demonstrations.

The policy is a tiny Llama-style model over the platform's byte-level tokenizer
(:mod:`services.runtime.tokenizer`), built here with a seeded random init: nothing is downloaded.
Demonstrations are rendered exactly as the rollout worker renders an episode (the task's agent
templates and the model's chat template) and stored as token ids, so supervised fine-tuning
trains on the very sequences the policy will generate (:mod:`trainer_client.sft`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from services.fleet.shell_tasks import AGENT, Problem, demonstration
from services.rollout_api.worker.conversation import system_message, task_message
from services.rollout_api.worker.tokenization import ChatTokenizer
from services.runtime.tokenizer import VOCAB_SIZE, write_tokenizer_dir

# The demo model's context, in tokens: its position embeddings, the engines' context length, the
# proxy's context cap, the trainer's sequence length and every trajectory's token limit.
CONTEXT_TOKENS = 1024


@dataclass(frozen=True)
class ModelShape:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2

    def trainer_env(self) -> dict[str, str]:
        """The same architecture for the trainer (``ROLLOUT_TRAIN_MODEL__*``)."""
        return {
            "ROLLOUT_TRAIN_MODEL__HIDDEN_SIZE": str(self.hidden), "ROLLOUT_TRAIN_MODEL__NUM_LAYERS": str(self.layers),
            "ROLLOUT_TRAIN_MODEL__NUM_ATTENTION_HEADS": str(self.heads),
            "ROLLOUT_TRAIN_MODEL__NUM_QUERY_GROUPS": str(self.kv_heads),
            "ROLLOUT_TRAIN_MODEL__FFN_HIDDEN_SIZE": str(2 * self.hidden),
            "ROLLOUT_TRAIN_MODEL__MAX_POSITION_EMBEDDINGS": str(CONTEXT_TOKENS),
        }  # fmt: skip


def initial_model(model_dir: Path, shape: ModelShape, seed: int) -> Path:
    """A tokenizer and a randomly initialised tiny Llama (HF format) in ``model_dir``: the base policy."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    write_tokenizer_dir(model_dir)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=shape.hidden, intermediate_size=2 * shape.hidden,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=CONTEXT_TOKENS, eos_token_id=258, pad_token_id=256, tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(model_dir)
    return model_dir


def write_tasks(path: Path, problems: list[Problem]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.task().model_dump_json() + "\n" for p in problems))
    return path


def write_demonstrations(
    path: Path, problems: list[Problem], model_dir: Path, teacher_accuracy: float, seed: int
) -> Path:
    """One imperfect-teacher demonstration per problem, as token ids (prompt, then reply + end of turn)."""
    tok = ChatTokenizer.from_dir(model_dir)
    rng = random.Random(seed)
    with path.open("w") as f:
        for problem in problems:
            messages = [
                {"role": "system", "content": system_message(AGENT)},
                {"role": "user", "content": task_message(problem.prompt, AGENT)},
            ]
            reply = demonstration(problem, rng, teacher_accuracy)
            doc = {"prompt_ids": tok.prompt_ids(messages), "response_ids": [*tok.encode(reply), tok.eos_id]}
            f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return path

"""The miniature task the embedded demo really learns, and the warm start that makes it learnable.

Tasks ask the agent to write the word ``yes`` into ``answer.txt`` (two phrasings, so a step has
two GRPO groups); the reward command checks the file. A tiny byte-level model cannot discover
the agent format (a THOUGHT, one bash block, then the submit command) from random weights in
minutes on a CPU, so the demo first fine-tunes it on demonstrations of the format in which the
word written is drawn at random from :data:`WORDS`: the warm-started policy follows the protocol
but writes the asked word only about half of the time. Raising that share is what RL has to do.
(A variant whose tasks ask for different words, so that the policy must read the word from the
prompt, did not learn within 40 steps of a prototype at this model size; this one went from
0.38 to about 0.9 in 20 steps of plain policy gradient at lr 3e-4.)

Demonstrations are rendered exactly as the worker renders an episode (its system prompt, task
message, observation format and the model's chat template), so the token sequences match.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from tqdm import tqdm

from services.protocol import RewardSpec, SandboxSpec, Task
from services.rollout_api.worker.conversation import SUBMIT_COMMAND, SYSTEM_PROMPT, task_message
from services.runtime.tokenizer import VOCAB_SIZE, write_tokenizer_dir

log = logging.getLogger(__name__)

# The demo model's context, in tokens: its position embeddings, the engines' context length, the
# proxy's context cap, the trainer's sequence length and every trajectory's token limit.
CONTEXT_TOKENS = 2048

WORDS = ("yes", "no")  # what the warm start writes, at random
TARGET = "yes"  # what the tasks ask for
PROMPTS = ("Write the word {w} into answer.txt.", "Put the word {w} in the file answer.txt.")
EOS = "<|im_end|>"


def tasks() -> list[Task]:
    return [
        Task(
            id=f"say-{TARGET}-{i}",
            prompt=prompt.format(w=TARGET),
            sandbox=SandboxSpec(template="default"),
            reward=RewardSpec(command=f"grep -qw {TARGET} answer.txt", timeout_s=10),
        )
        for i, prompt in enumerate(PROMPTS)
    ]


def render(messages: list[tuple[str, str]]) -> str:
    """The bundled tokenizer's ChatML template, with the generation prompt."""
    body = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return body + "<|im_start|>assistant\n"


def demonstration(task: Task, word: str) -> list[tuple[str, str]]:
    """(prompt text, reply text) per turn of one demonstrated episode that writes ``word``."""
    first = f"THOUGHT: I write the word into the file.\n\n```bash\necho {word} > answer.txt\n```"
    second = f"THOUGHT: Done.\n\n```bash\n{SUBMIT_COMMAND}\n```"
    turn1 = [("system", SYSTEM_PROMPT), ("user", task_message(task.prompt))]
    observed = "<returncode>0</returncode>\n<output>\n\n</output>"
    turn2 = [*turn1, ("assistant", first), ("user", observed)]
    return [(render(turn1), first + EOS), (render(turn2), second + EOS)]


def warm_start(model_dir: Path, *, steps: int = 250, seed: int = 0, hidden: int = 64) -> Path:
    """Write a tokenizer and a fine-tuned tiny Llama (HF format) into ``model_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from services.runtime.chat import load_tokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    write_tokenizer_dir(model_dir)
    tok = load_tokenizer(model_dir)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT_TOKENS, eos_token_id=258,
        pad_token_id=256, tie_word_embeddings=False, rms_norm_eps=1e-6,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pool = tasks()
    for _ in tqdm(range(steps), desc="warm start (format only)", unit="step"):
        loss = torch.zeros(())
        pairs = [
            pair for _ in range(4) for pair in demonstration(rng.choice(pool), rng.choice(WORDS))
        ]  # the word is random: only the format is taught
        for prompt, reply in pairs:
            p, r = tok.encode(prompt).ids, tok.encode(reply).ids
            ids = torch.tensor([p + r])
            labels = ids.clone()
            labels[0, : len(p)] = -100
            loss = loss + model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        (loss / len(pairs)).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    model.save_pretrained(model_dir)
    log.info("warm-started policy written to %s (final loss %.3f)", model_dir, float(loss) / len(pairs))
    return model_dir

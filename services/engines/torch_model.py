"""A real (tiny) causal LM behind the engine's SGLang-compatible API, for end-to-end learning.

SGLang cannot serve without a GPU. For demos and tests that must really learn, this serves a
Hugging Face Llama-style checkpoint (what the trainer exports) with transformers on the CPU:
sampling with the request's parameters, the logprob of every sampled token under the model
(temperature 1, as SGLang reports them), stop on eos or stop ids, and reloading weights from
disk on ``/update_weights_from_disk``. Calls are served one at a time (a lock): the models this
is for are tiny.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from services.engines.replies import Reply


@dataclass(frozen=True)
class Sampled:
    output_ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" | "length"
    matched: int | None = None  # the stop token that ended it


class TorchPolicy:
    """Loads a causal LM from a directory and samples from it."""

    def __init__(self, model_dir: Path, *, seed: int = 0, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self._lock = threading.Lock()
        self._generator = torch.Generator().manual_seed(seed)
        self.model_dir = model_dir
        self.model = self._load(model_dir)

    @staticmethod
    def _load(model_dir: Path) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.eval()  # type: ignore[no-untyped-call]
        return model

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.model.config, "eos_token_id", None)
        return eos[0] if isinstance(eos, list) else eos

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    def reload(self, model_dir: Path) -> None:
        """Swap in new weights (``/update_weights_from_disk``)."""
        model = self._load(model_dir)
        with self._lock:
            self.model, self.model_dir = model, model_dir

    @torch.inference_mode()
    def sample(
        self,
        input_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_token_ids: frozenset[int] = frozenset(),
        use_eos: bool = True,
        seed: int | None = None,
    ) -> Sampled:
        """``seed`` (SGLang's ``sampling_seed``): the draw depends only on it, the prompt and the weights."""
        stops = set(stop_token_ids)
        if use_eos and self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        with self._lock:
            return self._sample(input_ids, max_new_tokens, temperature, top_p, stops, generator or self._generator)

    def _sample(
        self, input_ids: list[int], max_new: int, temperature: float, top_p: float, stops: set[int],
        generator: torch.Generator,
    ) -> Sampled:  # fmt: skip
        ids = torch.tensor([input_ids], dtype=torch.long)
        out = self.model(input_ids=ids, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        output: list[int] = []
        lps: list[float] = []
        for _ in range(max_new):
            token = self._pick(logits, temperature, top_p, generator)
            lps.append(float(torch.log_softmax(logits.float(), dim=-1)[token]))
            output.append(token)
            if token in stops:
                return Sampled(output, lps, "stop", token)
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
        return Sampled(output, lps, "length")

    @torch.inference_mode()
    def prompt_logprobs(self, input_ids: list[int], start: int) -> list[float | None]:
        """SGLang's ``input_token_logprobs`` from ``start``: the logprob of each prompt token given the
        tokens before it (None for the first token of the prompt, which has no context)."""
        with self._lock:
            out = self.model(input_ids=torch.tensor([input_ids], dtype=torch.long))
        lps = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
        scored = lps.gather(1, torch.tensor(input_ids[1:]).unsqueeze(1)).squeeze(1).tolist()
        return [None, *scored][start:]

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
        if temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=generator))


class TorchReplies:
    """A :class:`~services.engines.replies.ReplySource` sampling from a :class:`TorchPolicy`.

    ``blocking``: the engine calls it in a thread. ``load_weights`` is what
    ``/update_weights_from_disk`` calls.
    """

    blocking = True

    def __init__(self, policy: TorchPolicy) -> None:
        self.policy = policy

    def reply(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        ignore_eos: bool,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Reply:
        sampled = self.policy.sample(
            list(prompt_ids), max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            use_eos=not ignore_eos, seed=seed,
        )  # fmt: skip
        ends = sampled.finish == "stop"
        tokens = sampled.output_ids[:-1] if ends else sampled.output_ids
        return Reply(token_ids=tokens, ends_with_eos=ends, logprobs=sampled.logprobs)

    def prompt_logprobs(self, prompt_ids: Sequence[int], start: int) -> list[float | None]:
        return self.policy.prompt_logprobs(list(prompt_ids), start)

    def load_weights(self, model_dir: Path) -> None:
        self.policy.reload(model_dir)

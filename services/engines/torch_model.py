"""A real (tiny) causal LM behind the engine's SGLang-compatible API, for end-to-end learning.

SGLang cannot serve without a GPU. For demos and tests that must really learn, this serves a
Hugging Face Llama-style checkpoint (what the trainer exports) on the CPU, loaded with transformers
and sampled through :mod:`services.engines.lean_llama` (the same forward without transformers' per-call
Python, about a third of its CPU per token; any other architecture through transformers' forward):
sampling with the request's parameters, the logprob of every sampled token under the model
(temperature 1, as SGLang reports them), stop on eos or stop ids, and reloading weights from
disk on ``/update_weights_from_disk``. Concurrent calls are decoded together in batches (one
generation thread): the models this is for are tiny, and one forward is mostly overhead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from services.engines.lean_llama import KVCache, LeanLlama
from services.engines.replies import Reply


@dataclass(frozen=True)
class Sampled:
    output_ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" | "length"
    matched: int | None = None  # the stop token that ended it


@dataclass
class _Request:
    input_ids: list[int]
    max_new: int
    temperature: float
    top_p: float
    stops: set[int]
    generator: torch.Generator | None = None  # the request's own (a fixed seed), else the policy's
    done: threading.Event = field(default_factory=threading.Event)
    result: Sampled | None = None
    error: BaseException | None = None


class TorchPolicy:
    """Loads a causal LM from a directory and samples from it, batching concurrent calls.

    Calls wait in a queue; one generation thread takes every waiting call (up to ``max_batch``)
    and decodes them together (left-padded, with an attention mask and per-row positions, so each
    row's logits are those of its sequence alone), then takes the next lot. For a tiny model one
    forward costs about the same for one row as for thirty: batching multiplies the throughput.
    """

    def __init__(self, model_dir: Path, *, seed: int = 0, threads: int = 1, max_batch: int = 64) -> None:
        torch.set_num_threads(threads)
        self._lock = threading.Lock()
        self._generator = torch.Generator().manual_seed(seed)
        self.model_dir = model_dir
        self.model = self._load(model_dir)
        self.lean = LeanLlama.of(self.model)
        self.max_batch = max_batch
        self._queue: queue.Queue[_Request] = queue.Queue()
        threading.Thread(target=self._serve, name="torch-generate", daemon=True).start()

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
    def pad_token_id(self) -> int:
        pad = getattr(self.model.config, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    def reload(self, model_dir: Path) -> None:
        """Swap in new weights (``/update_weights_from_disk``); a batch being decoded finishes on the old ones."""
        model = self._load(model_dir)
        lean = LeanLlama.of(model)
        with self._lock:
            self.model, self.lean, self.model_dir = model, lean, model_dir

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
        """Blocks until the generation thread has decoded this call (with whatever else was waiting).
        ``seed`` (SGLang's ``sampling_seed``): the draw depends only on it, the prompt and the weights."""
        stops = set(stop_token_ids)
        if use_eos and self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        request = _Request(list(input_ids), max_new_tokens, temperature, top_p, stops, generator)
        if max_new_tokens <= 0:
            return Sampled([], [], "length")
        self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _serve(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                with self._lock:
                    results = self._decode(batch)
                for request, result in zip(batch, results, strict=True):
                    request.result = result
            except Exception as exc:  # recorded on every call of the batch, raised in their threads
                for request in batch:
                    request.error = exc
            for request in batch:
                request.done.set()

    @torch.inference_mode()
    def _decode(self, batch: list[_Request]) -> list[Sampled]:
        width = max(len(r.input_ids) for r in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.bool)
        for row, r in enumerate(batch):
            ids[row, width - len(r.input_ids) :] = torch.tensor(r.input_ids)
            mask[row, width - len(r.input_ids) :] = True
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, positions, mask, None)
        outputs: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        finish: list[Sampled | None] = [None] * len(batch)
        sampler = _Sampler(batch, self._generator)
        for _ in range(max(r.max_new for r in batch)):
            picked = sampler.pick(logits)
            tokens = picked.tolist()
            lps = torch.log_softmax(logits, dim=-1).gather(1, picked.unsqueeze(1)).squeeze(1).tolist()
            for row, r in enumerate(batch):
                if finish[row] is None:
                    outputs[row].append(tokens[row])
                    logprobs[row].append(lps[row])
                    finish[row] = _finished(outputs[row], logprobs[row], r)
            if all(f is not None for f in finish):
                break
            mask = torch.cat([mask, torch.ones((len(batch), 1), dtype=torch.bool)], dim=1)
            positions = positions[:, -1:] + 1
            logits, cache = self._forward(picked.unsqueeze(1), positions, mask, cache)
        return [f for f in finish if f is not None]

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: KVCache | DynamicCache | None
    ) -> tuple[torch.Tensor, KVCache | DynamicCache]:
        """The last position's logits (rows, vocab) for the new tokens ``ids`` and the grown cache: the
        lean forward where the model has one, else transformers' (``mask``: True at every real token so far)."""
        if self.lean is not None:
            return self.lean.forward(ids, positions, mask, cache)  # type: ignore[arg-type]
        out = self.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, cache=cache, use_cache=True)
        return out.logits[:, -1].float(), out.cache

    @torch.inference_mode()
    def prompt_logprobs(self, input_ids: list[int], start: int) -> list[float | None]:
        """SGLang's ``input_token_logprobs`` from ``start``: the logprob of each prompt token given the
        tokens before it (None for the first token of the prompt, which has no context)."""
        with self._lock:
            out = self.model(input_ids=torch.tensor([input_ids], dtype=torch.long))
        lps = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
        scored = lps.gather(1, torch.tensor(input_ids[1:]).unsqueeze(1)).squeeze(1).tolist()
        return [None, *scored][start:]


class _Sampler:
    """A batch's rows sampled together, each with its own temperature, top-p and generator: one
    uniform draw per row from its generator (the draw still depends only on the row's seed, prompt
    and weights), the rest vectorised over the batch (inverse CDF). Row by row, softmax, sort and
    ``torch.multinomial`` cost about 65 us per row and token, a fifth of a batch's decode."""

    def __init__(self, batch: Sequence[_Request], default: torch.Generator) -> None:
        self.generators = [r.generator or default for r in batch]
        temperatures = torch.tensor([r.temperature for r in batch], dtype=torch.float32)
        self.greedy = temperatures <= 0
        self.all_greedy, self.any_greedy = bool(self.greedy.all()), bool(self.greedy.any())
        self.temperatures = torch.where(self.greedy, torch.ones_like(temperatures), temperatures).unsqueeze(1)
        top_p = torch.tensor([r.top_p for r in batch], dtype=torch.float32)
        self.top_p = top_p.unsqueeze(1) if bool((top_p < 1.0).any()) else None

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row of ``logits`` (rows, vocab): argmax at temperature 0, else a draw from
        softmax(logits / temperature), cut to the smallest set of tokens whose mass reaches top-p."""
        if self.all_greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / self.temperatures, dim=-1)
        if self.top_p is not None:
            ordered, order = torch.sort(probs, dim=-1, descending=True)
            kept = ordered * ((torch.cumsum(ordered, dim=-1) - ordered) < self.top_p)
            probs = torch.zeros_like(probs).scatter(1, order, kept)
        cdf = torch.cumsum(probs, dim=-1)
        draws = torch.cat([torch.rand(1, generator=g) for g in self.generators]) * cdf[:, -1]
        sampled = torch.searchsorted(cdf, draws.unsqueeze(1), right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
        return torch.where(self.greedy, logits.argmax(dim=-1), sampled) if self.any_greedy else sampled


def _finished(output: list[int], logprobs: list[float], request: _Request) -> Sampled | None:
    """The call's answer once its last token is a stop token or its budget is spent; else None."""
    if output[-1] in request.stops:
        return Sampled(output, logprobs, "stop", output[-1])
    if len(output) >= request.max_new:
        return Sampled(output, logprobs, "length")
    return None


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

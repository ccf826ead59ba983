"""One simulated engine: validation, replies, the batch, weights and the control operations."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.engines.batching import BatchTiming, Generation, PauseMode, Scheduler
from services.engines.metrics import BatchSnapshot, EngineMetrics
from services.engines.prefix_cache import PrefixCache
from services.engines.replies import Reply, ReplySource, prompt_hash, token_logprob
from services.engines.settings import EngineSettings
from services.engines.tokenization import TextCodec

log = logging.getLogger(__name__)

SIM_VERSION = "0.5.5-sim"


class EngineRequestError(ValueError):
    """A request the engine refuses with HTTP 400 (SGLang's wording in ``message``)."""


@dataclass(frozen=True, slots=True)
class GenerateParams:
    max_new_tokens: int | None
    ignore_eos: bool = False
    stream: bool = False
    return_logprob: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None  # SGLang's ``sampling_seed``
    logprob_start_len: int = -1  # SGLang: >= 0 also returns the prompt's logprobs from there (torch mode)


class Engine:
    """What one SGLang server would be, minus the GPU."""

    def __init__(self, settings: EngineSettings, port: int, replies: ReplySource, codec: TextCodec | None) -> None:
        self.settings = settings
        self.port = port
        self.engine_id = f"engine-{port}"
        self.replies = replies
        self.codec = codec
        self.eos_token_id = codec.eos_token_id if codec else settings.eos_token_id
        self.weight_version = settings.weight_version
        self.model_path = str(settings.model_path or settings.served_model_name)
        self.cache = PrefixCache(settings.prefix_cache_entries)
        self.scheduler = Scheduler(
            BatchTiming(
                prefill_s_per_token=settings.prefill_s_per_token,
                decode_step_s=settings.decode_step_s,
                decode_step_per_request_s=settings.decode_step_per_request_s,
                kv_capacity_tokens=settings.kv_capacity_tokens,
                max_running_requests=settings.max_running_requests,
            )
        )
        self.metrics = EngineMetrics(settings.served_model_name)
        self.lora_adapters: dict[str, str] = {}  # name -> path
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self.scheduler.run(), name=f"{self.engine_id}-batch")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    # -- requests -----------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        if self.codec is None:
            raise EngineRequestError("This engine has no tokenizer (started without --model-path): send input_ids.")
        return self.codec.encode(text)

    def effective_max_new_tokens(self, prompt_len: int, requested: int | None) -> int:
        """SGLang's length checks; an omitted ``max_new_tokens`` may fill the whole context."""
        context = self.settings.context_length
        if prompt_len >= context:
            raise EngineRequestError(
                f"The input ({prompt_len} tokens) is longer than the model's context length ({context} tokens)."
            )
        if requested is None:
            return context - prompt_len - 1
        if prompt_len + requested >= context:
            raise EngineRequestError(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {prompt_len + requested} tokens: {prompt_len} tokens from the input "
                f"messages and {requested} tokens for the completion. Please reduce the number of tokens in the "
                "input messages or the completion to fit within the limit."
            )
        return max(0, requested)

    async def generate(self, prompt_ids: list[int], params: GenerateParams, rid: str | None) -> Generation:
        """Validate, pick the answer, wait its scripted latency, and queue it in the batch."""
        if not prompt_ids:
            raise EngineRequestError("The input is empty.")
        max_new = self.effective_max_new_tokens(len(prompt_ids), params.max_new_tokens)
        reply = await self._reply(prompt_ids, max_new, params)
        planned = reply.token_ids[:max_new]
        ends_with_eos = reply.ends_with_eos and not params.ignore_eos and len(planned) < max_new
        if ends_with_eos:
            planned = [*planned, self.eos_token_id]
        gen = Generation(
            rid=rid or uuid.uuid4().hex,
            prompt_len=len(prompt_ids),
            planned_ids=planned,
            ends_with_eos=ends_with_eos,
            stream=params.stream,
            cached_tokens=self.cache.lookup(prompt_ids),
            logprobs=reply.logprobs,
            input_logprobs=await self._input_logprobs(prompt_ids, params),
        )
        if reply.latency_s > 0:
            await asyncio.sleep(reply.latency_s)
        self.scheduler.submit(gen)
        return gen

    async def _reply(self, prompt_ids: list[int], max_new: int, params: GenerateParams) -> Reply:
        """Ask the reply source; a source that computes (a real model) runs in a thread."""
        call = functools.partial(
            self.replies.reply, prompt_ids, max_new, ignore_eos=params.ignore_eos, temperature=params.temperature,
            top_p=params.top_p, seed=params.seed,
        )  # fmt: skip
        if getattr(self.replies, "blocking", False):
            return await asyncio.to_thread(call)
        return call()

    async def _input_logprobs(self, prompt_ids: list[int], params: GenerateParams) -> list[float | None] | None:
        """The prompt tokens' logprobs under the served weights, where asked and the source can score them."""
        score = getattr(self.replies, "prompt_logprobs", None)
        if not params.return_logprob or params.logprob_start_len < 0 or score is None:
            return None
        result: list[float | None] = await asyncio.to_thread(score, prompt_ids, params.logprob_start_len)
        return result

    def cancel(self, gen: Generation) -> None:
        self.scheduler.cancel(gen)

    def output_ids(self, gen: Generation) -> list[int]:
        return gen.planned_ids[: self.scheduler.produced(gen)]

    def finish_reason(self, gen: Generation) -> dict[str, Any] | None:
        if gen.abort_reason is not None:
            return gen.abort_reason
        if gen.final_len is None:
            return None
        if gen.ends_with_eos and gen.final_len == gen.target_len:
            return {"type": "stop", "matched": self.eos_token_id}
        return {"type": "length", "length": gen.final_len}

    def meta_info(self, gen: Generation, prompt_ids: Sequence[int], *, logprobs: bool) -> dict[str, Any]:
        """SGLang's ``meta_info``; ``weight_version`` is read now, when the output is assembled."""
        out = self.output_ids(gen)
        meta: dict[str, Any] = {
            "id": gen.rid,
            "finish_reason": self.finish_reason(gen),
            "prompt_tokens": gen.prompt_len,
            "completion_tokens": len(out),
            "cached_tokens": gen.cached_tokens,
            "weight_version": self.weight_version,
            "num_retractions": gen.retractions,
            "e2e_latency": time.monotonic() - gen.created,
        }
        if logprobs:
            key = prompt_hash(prompt_ids)
            own = gen.logprobs
            meta["output_token_logprobs"] = [
                [own[i] if own is not None and i < len(own) else round(token_logprob(self.settings.seed, key, i), 6),
                 tok, None]
                for i, tok in enumerate(out)
            ]  # fmt: skip
            if (given := gen.input_logprobs) is not None:
                scored = prompt_ids[len(prompt_ids) - len(given) :]
                meta["input_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(given, scored, strict=True)]
        return meta

    def text_of(self, ids: Sequence[int]) -> str | None:
        return self.codec.decode(ids) if self.codec else None

    def record_finished(self, gen: Generation, prompt_ids: list[int]) -> None:
        if gen.abort_reason is None:
            self.cache.insert(prompt_ids + self.output_ids(gen))
        self.metrics.observe_finished(gen.prompt_len, gen.final_len or 0, time.monotonic() - gen.created)

    def render_metrics(self) -> bytes:
        s = self.scheduler
        snap = BatchSnapshot(
            running=len(s.running),
            waiting=len(s.waiting),
            used_tokens=s.used_tokens(),
            capacity_tokens=s.timing.kv_capacity_tokens,
            cache_hit_rate=self.cache.hit_rate,
            retractions=s.total_retractions,
            generated_tokens_total=s.generated_tokens_total,
        )
        return self.metrics.render(snap, time.monotonic())

    # -- control plane ------------------------------------------------------------------

    def pause(self, mode: PauseMode) -> None:
        log.info("%s: pause_generation mode=%s", self.engine_id, mode)
        self.scheduler.pause(mode)

    def resume(self) -> None:
        log.info("%s: continue_generation", self.engine_id)
        self.scheduler.resume()

    async def update_weights(self, model_path: str, version: str | None, *, abort_all: bool) -> tuple[bool, str]:
        """Simulate a load from disk; the path must exist (as for SGLang) unless fault injection says no."""
        if abort_all:
            self.scheduler.abort("", abort_all=True)
        await asyncio.sleep(self.settings.weight_load_s)
        if self.settings.fail_weight_updates:
            return False, "Failed to update weights: simulated failure (--fail-weight-updates)."
        if not await asyncio.to_thread(Path(model_path).exists):
            return False, f"Failed to update weights: model path {model_path} does not exist."
        load = getattr(self.replies, "load_weights", None)
        if load is not None:
            try:
                await asyncio.to_thread(load, Path(model_path))
            except (OSError, ValueError) as exc:
                return False, f"Failed to update weights: {exc}"
        self.model_path = model_path
        if version is not None:
            self.weight_version = version
        self.cache.flush()
        log.info("%s: weights updated from %s, version %s", self.engine_id, model_path, self.weight_version)
        return True, "Succeeded to update model weights."

    def flush_cache(self) -> bool:
        if self.scheduler.busy():
            return False
        self.cache.flush()
        return True

    def load(self) -> list[dict[str, Any]]:
        s = self.scheduler
        return [
            {
                "dp_rank": 0,
                "num_reqs": len(s.running) + len(s.waiting),
                "num_running_reqs": len(s.running),
                "num_waiting_reqs": len(s.waiting),
                "num_tokens": s.used_tokens(),
            }
        ]

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": str(self.settings.model_path) if self.settings.model_path else None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    def server_info(self) -> dict[str, Any]:
        s = self.settings
        return {
            "model_path": self.model_path,
            "served_model_name": s.served_model_name,
            "host": s.host,
            "port": self.port,
            "context_length": s.context_length,
            "max_running_requests": s.max_running_requests,
            "max_total_num_tokens": s.kv_capacity_tokens,
            "skip_tokenizer_init": self.codec is None,
            "random_seed": s.seed,
            "weight_version": self.weight_version,
            "version": SIM_VERSION,
            "internal_states": [
                {"paused": self.scheduler.paused, "total_retractions": self.scheduler.total_retractions}
            ],
            "engine_id": self.engine_id,
            "sim_mode": s.mode,
        }

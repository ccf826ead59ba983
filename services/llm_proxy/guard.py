"""The context guard: every call leaves the proxy with ``max_new_tokens`` set and within the cap.

Token-id requests are checked exactly: a prompt that leaves no room is refused with
``context_length_exceeded`` (the worker ends that trajectory as truncated), and
``max_new_tokens`` becomes min(requested, per-call cap, context cap - prompt - 1); the ``- 1``
keeps prompt + new tokens below the cap, as SGLang's own check (``>=``) requires. Text requests
cannot be counted here: their ``max_new_tokens`` is capped and the engine's own length error is
mapped to the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.llm_proxy.body import ParsedBody
from services.protocol import ErrorCode, PlatformError

ENGINE_LENGTH_MARKERS = ("context length", "maximum context length", "longer than the model")


@dataclass(frozen=True, slots=True)
class ContextGuard:
    context_cap: int
    max_new_tokens_cap: int

    def guard_generate(self, body: dict[str, Any], prompt_len: int | None = None) -> int | None:
        """Clamp a native ``/generate`` body in place; returns the prompt length when known.
        ``prompt_len`` is given when ``input_ids`` was counted without being decoded."""
        sampling = body.get("sampling_params")
        if sampling is None:
            sampling = body["sampling_params"] = {}
        elif not isinstance(sampling, dict):
            raise PlatformError(
                ErrorCode.VALIDATION_ERROR, "sampling_params must be an object", field="sampling_params"
            )
        if prompt_len is None:
            ids = body.get("input_ids")
            prompt_len = len(ids) if isinstance(ids, list) else None
        sampling["max_new_tokens"] = self._clamp(sampling.get("max_new_tokens"), prompt_len)
        return prompt_len

    def guard_parsed(self, parsed: ParsedBody) -> None:
        """``guard_generate`` for a body whose ``input_ids`` may not be counted yet: a prompt whose
        upper bound leaves room for ``max_new_tokens_cap`` gets the same clamp without the count."""
        at_most = parsed.prompt_len_at_most
        if parsed.ids is not None and at_most is not None and at_most + self.max_new_tokens_cap + 1 <= self.context_cap:
            self.guard_generate(parsed.doc)
        else:
            self.guard_generate(parsed.doc, parsed.prompt_len)

    def guard_openai(self, body: dict[str, Any]) -> None:
        """Clamp an OpenAI body: ``max_tokens`` / ``max_completion_tokens``; a token-id prompt is counted."""
        prompt = body.get("prompt")
        prompt_len = len(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else None
        requested = body.get("max_completion_tokens", body.get("max_tokens"))
        limit = self._clamp(requested, prompt_len)
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = limit

    def _clamp(self, requested: object, prompt_len: int | None) -> int:
        if requested is not None and (not isinstance(requested, int) or requested < 0):
            raise PlatformError(ErrorCode.VALIDATION_ERROR, "max_new_tokens must be a non-negative integer")
        limit = self.max_new_tokens_cap if requested is None else min(requested, self.max_new_tokens_cap)
        if prompt_len is None:
            return limit
        room = self.context_cap - prompt_len - 1
        if room <= 0:
            raise PlatformError(
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"the prompt has {prompt_len} tokens; the context cap is {self.context_cap}",
                field="input_ids",
            )
        return min(limit, room)


def is_engine_length_error(message: str) -> bool:
    """Whether an engine's 400 message is its context-length refusal."""
    lowered = message.lower()
    return any(marker in lowered for marker in ENGINE_LENGTH_MARKERS)

"""Logprobs on SGLang's OpenAI routes, in OpenAI's two shapes, from the values ``/generate`` returns.

Asked for with ``logprobs: true`` (and ``top_logprobs: N``, 0-20) on ``/v1/chat/completions``, or
``logprobs: N`` (0-5) on ``/v1/completions``. Each generated token's logprob is the one
``/generate`` gives for the same prompt (``Engine.meta_info``), and its alternatives are those of
``top_logprobs_num`` (``replay.top_logprobs``): the sampled token first. The end-of-sequence token
that ends a chat turn carries no content and is left out, as OpenAI does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.engines.batching import Generation
from services.engines.engine import Engine, EngineRequestError
from services.engines.replay import top_logprobs

MAX_TOP_CHAT = 20  # OpenAI's bound on ``top_logprobs``
MAX_TOP_COMPLETIONS = 5  # OpenAI's bound on the legacy ``logprobs``


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    top: int  # alternatives per token (0: only the sampled token's logprob)

    @classmethod
    def of(cls, body: dict[str, Any], *, chat: bool) -> LogprobRequest | None:
        """What the call asks for; None when it asks for no logprobs; EngineRequestError when malformed."""
        if chat:
            wanted, top = body.get("logprobs"), body.get("top_logprobs")
            if wanted not in (None, True, False):
                raise EngineRequestError("logprobs must be a boolean")
            if top is not None and not wanted:
                raise EngineRequestError("top_logprobs needs logprobs: true")
            return cls(_count(top or 0, "top_logprobs", MAX_TOP_CHAT)) if wanted else None
        legacy = body.get("logprobs")
        return None if legacy is None else cls(_count(legacy, "logprobs", MAX_TOP_COMPLETIONS))


def _count(value: Any, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise EngineRequestError(f"{name} must be an integer between 0 and {limit}")
    return value


def _per_token(engine: Engine, gen: Generation, prompt_ids: list[int], top: int) -> list[tuple[int, float, list[Any]]]:
    """(token, logprob, alternatives as [logprob, token, None]) per generated token."""
    meta = engine.meta_info(gen, prompt_ids, logprobs=True)
    entries = meta.get("output_token_logprobs") or []
    alternatives = top_logprobs(meta, top, engine.settings.vocab_size) if top else [[] for _ in entries]
    return [(int(tok), float(lp), alts) for (lp, tok, _), alts in zip(entries, alternatives, strict=True)]


def _token(engine: Engine, token: int, logprob: float) -> dict[str, Any]:
    text = engine.text_of([token]) or ""
    return {"token": text, "bytes": list(text.encode()), "logprob": logprob}


def chat_logprobs(
    engine: Engine, gen: Generation, prompt_ids: list[int], asked: LogprobRequest, start: int = 0
) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat completion, for the tokens from ``start`` on."""
    content = []
    for token, logprob, alts in _per_token(engine, gen, prompt_ids, asked.top)[start:]:
        if token == engine.eos_token_id:
            continue
        entry = _token(engine, token, logprob)
        entry["top_logprobs"] = [_token(engine, int(t), float(lp)) for lp, t, _ in alts[: asked.top]]
        content.append(entry)
    return {"content": content}


def completion_logprobs(
    engine: Engine, gen: Generation, prompt_ids: list[int], asked: LogprobRequest, start: int = 0
) -> dict[str, Any]:
    """``choices[].logprobs`` of a legacy completion (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    offset = len(engine.text_of(engine.output_ids(gen)[:start]) or "")
    for token, logprob, alts in _per_token(engine, gen, prompt_ids, asked.top)[start:]:
        text = engine.text_of([token]) or ""
        tokens.append(text)
        logprobs.append(logprob)
        tops.append({engine.text_of([int(t)]) or "": float(lp) for lp, t, _ in alts[: asked.top]})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops if asked.top else None,
            "text_offset": offsets}  # fmt: skip

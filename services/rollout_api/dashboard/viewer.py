"""One trajectory for the viewer (its JSON plus the text of every token), and JSON-lines export."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

from services.protocol import ErrorCode, PlatformError, from_stream_fields, keys, trajectory_to_json
from services.rollout_api.dashboard.summaries import Filters, entries_before, summary

log = logging.getLogger(__name__)


class TokenTexts:
    """Token id -> text with the policy's tokenizer (``tokenizer_path``); None when none is configured."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    @cached_property
    def tokenizer(self) -> Any:
        if self.path is None:
            return None
        from services.runtime.chat import load_tokenizer

        try:
            return load_tokenizer(self.path)
        except Exception:  # a broken tokenizer must not break the viewer: it shows ids instead
            log.warning("cannot load the tokenizer at %s; the viewer shows token ids", self.path, exc_info=True)
            return None

    def texts(self, ids: list[int]) -> list[str] | None:
        if self.tokenizer is None:
            return None
        texts: list[str] = self.tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
        return texts


async def detail(redis: Redis, job: str, entry_id: str, tokens: TokenTexts) -> bytes:
    """``{"entry_id", "prompt_text", "token_texts", "trajectory"}`` for one stream entry."""
    found: Any = await redis.xrange(keys.trajectory_stream(job), min=entry_id, max=entry_id, count=1)
    if not found:
        raise PlatformError(ErrorCode.NOT_FOUND, f"no trajectory entry {entry_id!r} in job {job!r}")
    traj = from_stream_fields(found[0][1])
    prompt = tokens.texts(list(traj.prompt_ids))
    return msgspec.json.encode({
        "entry_id": entry_id,
        "prompt_text": "".join(prompt) if prompt is not None else None,
        "token_texts": tokens.texts(list(traj.response_ids)),
        "trajectory": msgspec.Raw(trajectory_to_json(traj)),
    })  # fmt: skip


async def jsonl(redis: Redis, job: str, filters: Filters, limit: int) -> AsyncIterator[bytes]:
    """Matching trajectories as JSON lines, newest first, among the latest ``limit`` entries."""
    async for _, fields in entries_before(redis, job, None, limit):
        if filters.match(summary(fields)):
            yield trajectory_to_json(from_stream_fields(fields)) + b"\n"

"""The token sequence of one episode, held by the worker (never re-tokenized)."""

from __future__ import annotations

from array import array

import orjson

from services.protocol import logprobs, mask, token_ids


class TokenBuffer:
    """``prompt_ids`` then ``response_ids`` (generated tokens, mask 1, engine logprobs; observation
    tokens, mask 0, logprob 0.0), laid out as ``protocol.trajectory`` documents.

    The context is also kept JSON-encoded and grown by each turn's new tokens only, so an LLM call
    costs the encoding of its delta, not of the whole (up to 64K-token) context every turn."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self._json = bytearray()  # the context's ids, comma-separated

    def _encode(self, ids: list[int]) -> None:
        if not ids:
            return
        if self._json:
            self._json += b","
        self._json += orjson.dumps(ids)[1:-1]

    @property
    def total(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def set_prompt(self, ids: list[int]) -> None:
        self.prompt_ids = list(ids)
        self._json = bytearray()
        self._encode(self.prompt_ids)
        self._encode(self.response_ids)

    def add_generated(self, ids: list[int], lps: list[float]) -> None:
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += lps
        self._encode(ids)

    def add_observation(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self._encode(ids)

    def context(self) -> list[int]:
        """The input ids of the next LLM call."""
        return self.prompt_ids + self.response_ids

    def context_json(self) -> bytes:
        """:meth:`context` as a JSON array, without encoding it again."""
        return b"[" + self._json + b"]"

    def arrays(self) -> tuple[array, array, array, array]:  # type: ignore[type-arg]
        return token_ids(self.prompt_ids), token_ids(self.response_ids), mask(self.loss_mask), logprobs(self.logprobs)

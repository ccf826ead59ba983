"""Request bodies parsed only as far as the guard and routing need.

A ``/generate`` body is mostly its ``input_ids`` array (64K tokens are ~400 KB of JSON). Decoding
it into 64K Python ints and encoding them again costs milliseconds of the proxy's CPU per call
and tells the proxy nothing it cannot get by counting commas. So the array's bytes are cut out
before the rest of the body is decoded, counted, and spliced back unchanged into the body that
goes to the engine. Anything unusual (nested arrays, strings, a key that is not top-level) falls
back to a plain full decode, so the result is always the same as decoding everything.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

IDS_KEY = "input_ids"
_IDS_START = re.compile(rb'"input_ids"\s*:\s*\[')
_NOT_FLAT = (b'"', b"[", b"{")  # an array of numbers holds none of these


class ParsedBody:
    """``doc`` is the body; when ``ids`` is set, ``doc`` lacks ``input_ids`` and ``ids`` holds the
    array's raw bytes (between the brackets), counted only when ``prompt_len`` is read: counting the
    commas of a 2K-token prompt costs more CPU than the rest of parsing it, and the guard needs
    the count only near the context cap (``prompt_len_at_most`` tells it when)."""

    __slots__ = ("_prompt_len", "doc", "ids")

    def __init__(self, doc: dict[str, Any], ids: bytes | None = None, prompt_len: int | None = None) -> None:
        self.doc = doc
        self.ids = ids
        self._prompt_len = prompt_len

    @property
    def prompt_len(self) -> int | None:
        if self._prompt_len is None and self.ids is not None:
            stripped = self.ids.strip()
            self._prompt_len = stripped.count(b",") + 1 if stripped else 0
        return self._prompt_len

    @property
    def prompt_len_at_most(self) -> int | None:
        """An upper bound on ``prompt_len`` without counting: every element takes a digit and a comma
        but the last."""
        if self._prompt_len is None and self.ids is not None:
            return (len(self.ids) + 1) // 2
        return self._prompt_len

    def encode(self) -> bytes:
        """The body for the engine: ``doc`` with the original ``input_ids`` bytes put back."""
        rest = orjson.dumps(self.doc)
        if self.ids is None:
            return rest
        if rest == b"{}":
            return b"".join((b'{"input_ids":[', self.ids, b"]}"))
        return b"".join((b'{"input_ids":[', self.ids, b"],", memoryview(rest)[1:]))


def parse_body(raw: bytes, *, whole: bool = False) -> ParsedBody:
    """Decode ``raw`` (a JSON object) without materialising a flat top-level ``input_ids`` array
    (unless ``whole``).

    Raises ``orjson.JSONDecodeError`` when the body is not JSON and ``TypeError`` when it is not an object.
    """
    split = None if whole else _split_ids(raw)
    if split is not None:
        reduced, ids = split
        try:
            doc = orjson.loads(reduced)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and doc.get(IDS_KEY) == []:
            del doc[IDS_KEY]
            return ParsedBody(doc, ids)
    doc = orjson.loads(raw)
    if not isinstance(doc, dict):
        raise TypeError("the body must be a JSON object")
    ids_value = doc.get(IDS_KEY)
    return ParsedBody(doc, None, len(ids_value) if isinstance(ids_value, list) else None)


def _split_ids(raw: bytes) -> tuple[bytes, bytes] | None:
    """``(raw with the array emptied, the array's inner bytes)`` or None when there is no flat array."""
    found = _IDS_START.search(raw)
    if found is None:
        return None
    start = found.end()
    end = raw.find(b"]", start)
    if end < 0:
        return None
    ids = raw[start:end]
    if any(marker in ids for marker in _NOT_FLAT):
        return None
    return raw[:start] + raw[end:], ids

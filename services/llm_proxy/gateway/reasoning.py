"""The model's reasoning at the head of a reply (``<think>...</think>``, as Qwen3/QwQ/DeepSeek-R1
templates write it), split off for the dialects that carry it apart from the answer: OpenAI
Responses ``reasoning`` items and Anthropic ``thinking`` blocks.

The split is exact: ``raw`` is the reply's text up to the answer, verbatim (tags and whitespace
included), so ``raw + rest`` is the text the gateway recorded. The dialects hand ``raw`` to the
client in the opaque field the client returns unchanged (Responses ``encrypted_content``,
Anthropic ``signature``); a reasoning part that comes back with it is joined again verbatim, so the
conversation re-renders as sampled and the next call merges. One that comes back without it is
wrapped in the tags again (it may then not re-render as sampled: a mismatch or a new segment, never
patched ids). A reply without the tags has no reasoning part.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

_HEAD = re.compile(r"\A\s*<think>(.*?)</think>\s*", re.DOTALL)
_SEAL = "rollout-reasoning:"  # marks an opaque field as ours


@dataclass(frozen=True, slots=True)
class Split:
    raw: str  # the reasoning as generated, tags and surrounding whitespace included ("" when none)
    text: str  # the reasoning alone (between the tags)
    rest: str  # the answer after it


def split(content: str) -> Split:
    found = _HEAD.match(content)
    if found is None:
        return Split("", "", content)
    return Split(found.group(0), found.group(1).strip(), content[found.end() :])


def seal(raw: str) -> str:
    """``raw`` as an opaque string the client returns unchanged."""
    return _SEAL + base64.b64encode(raw.encode()).decode()


def unseal(opaque: object, text: str) -> str:
    """The verbatim reasoning from an opaque field of ours, else ``text`` wrapped in the tags."""
    if isinstance(opaque, str) and opaque.startswith(_SEAL):
        try:
            return base64.b64decode(opaque[len(_SEAL) :], validate=True).decode()
        except ValueError:
            pass
    return f"<think>\n{text}\n</think>\n\n" if text else ""

"""What a data-plane call must look like before it reaches an engine (a malformed call is the
caller's 400, never an engine's 502 reported as infrastructure).

Bounds, documented in docs/llm_proxy.md: ``X-Deadline-S`` in (0, 86,400]; a session id is
printable ASCII of at most 256 characters; ``input_ids`` are non-negative integers (below 2^31
when the body is decoded; on the fast path, where the array is only counted, digits, commas and
spaces only: the engine refuses ids past its vocabulary); a chat
call has a non-empty list of message objects; a completion prompt is a string, a list of
strings or a list of token ids. JSON itself is parsed by orjson, which refuses NaN, Infinity
and numbers past the double range.
"""

from __future__ import annotations

import math
import re
from typing import Any

from services.llm_proxy.body import ParsedBody
from services.llm_proxy.responses import CallRequest
from services.protocol import ErrorCode, PlatformError
from services.protocol import llm as h

MAX_DEADLINE_S = 86_400.0
MIN_DEADLINE_S = 1.0  # an LLM call cannot answer sooner; a smaller X-Deadline-S is a client mistake (422)
MAX_TOKEN_ID = 2**31 - 1
_ID_BYTES = b"0123456789, \t\r\n"
SESSION = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no spaces: it is forwarded as a header


def _bad(message: str, field: str) -> PlatformError:
    return PlatformError(ErrorCode.VALIDATION_ERROR, message, field=field)


def session_of(request: CallRequest, body: dict[str, Any]) -> str | None:
    header = request.headers.get(h.HEADER_SESSION)
    value = header if header is not None else body.pop(h.BODY_SESSION, None)
    if value is None:
        return None
    if not isinstance(value, str) or not SESSION.match(value):
        raise _bad("a session id is 1-256 printable ASCII characters", h.HEADER_SESSION)
    return value


def check_shape(route: str, parsed: ParsedBody) -> None:
    body = parsed.doc
    if route == "/generate":
        if parsed.ids is not None:  # the fast path: the array was counted, not decoded
            if parsed.ids.translate(None, _ID_BYTES):
                raise _bad("input_ids must be a list of non-negative integers", "input_ids")
            return
        _check_generate(body)
    elif route == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _bad("messages must be a non-empty list of message objects", "messages")
    else:
        prompt = body.get("prompt")
        if not _is_prompt(prompt):
            raise _bad("prompt must be a string, a list of strings or a list of token ids", "prompt")


def _check_generate(body: dict[str, Any]) -> None:
    ids, text = body.get("input_ids"), body.get("text")
    if ids is None and not isinstance(text, str | list):
        raise _bad("/generate needs input_ids or text", "input_ids")
    if ids is not None and not _token_ids(ids):
        raise _bad(f"input_ids must be a list of integers in [0, {MAX_TOKEN_ID}]", "input_ids")


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in value
    )


def _is_prompt(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and (all(isinstance(p, str) for p in value) or _token_ids(value))


def deadline_of(request: CallRequest, default: float | None) -> float | None:
    raw = request.headers.get(h.HEADER_DEADLINE)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (MIN_DEADLINE_S <= value <= MAX_DEADLINE_S):  # also refuses nan and inf
        raise PlatformError(
            ErrorCode.VALIDATION_ERROR,
            f"{h.HEADER_DEADLINE} must be seconds in [{MIN_DEADLINE_S:g}, {MAX_DEADLINE_S:g}]",
            field=h.HEADER_DEADLINE,
        )  # fmt: skip
    return value

"""The bits of the Connect protocol (connectrpc.com/docs/protocol) a fake envd needs: enveloped
JSON messages for server streams, and end-of-stream frames."""

from __future__ import annotations

import json
import struct
from typing import Any

STREAM_CONTENT_TYPE = "application/connect+json"
END_STREAM = 0x02


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def end_stream(error: dict[str, str] | None = None) -> bytes:
    return envelope({"error": error} if error else {}, END_STREAM)


def first_message(body: bytes) -> dict[str, Any]:
    """The first enveloped message of a streaming request body."""
    if len(body) < 5:
        return {}
    _, length = struct.unpack(">BI", body[:5])
    message: dict[str, Any] = json.loads(body[5 : 5 + length] or b"{}")
    return message

"""What a request's top-level fields do to the tokens, per route: honoured, refused, or unused.

- Honoured: the fields the gateway turns into the prompt or the engine call (messages, tools,
  ``max_tokens``, ``stop``, ...).
- Refused with a 400 naming the field: a field that would change what is generated and that the
  gateway cannot honour (structured output, forced tool calls, logit biases, audio, ...). Nothing
  of the kind is silently dropped.
- Unused: everything else present, known or not (``temperature`` and the other sampling
  parameters: the episode's sampling applies; ``metadata``, ``store``, ``thinking``, cache keys,
  unknown fields, ...). Accepted, and listed in the call's record in the session log
  (``GatewayCall.unused_fields``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.protocol import ErrorCode, PlatformError

Check = Callable[[Any], str | None]  # a field's value -> why it is refused (None: fine)

HONOURED: dict[str, frozenset[str]] = {
    "chat": frozenset(
        [
            "model",
            "messages",
            "tools",
            "tool_choice",
            "stream",
            "stream_options",
            "n",
            "logprobs",
            "top_logprobs",
            "max_tokens",
            "max_completion_tokens",
            "stop",
        ]
    ),
    "completions": frozenset(["model", "prompt", "stream", "n", "logprobs", "max_tokens", "stop", "echo"]),
    "messages": frozenset(
        ["model", "messages", "system", "tools", "tool_choice", "stream", "max_tokens", "stop_sequences"]
    ),
    "responses": frozenset(
        [
            "model",
            "input",
            "instructions",
            "tools",
            "tool_choice",
            "stream",
            "previous_response_id",
            "max_output_tokens",
            "text",
        ]
    ),
}


def _set(reason: str) -> Check:
    return lambda value: reason if value not in (None, False, {}, [], "") else None


def _format(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else value
    return None if kind in (None, "text") else f"response format {kind!r} needs constrained decoding"


def _chat_choice(value: Any) -> str | None:
    return None if value in (None, "auto", "none") else "a forced tool call needs constrained decoding"


def _messages_choice(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else value
    return None if kind in (None, "auto", "none") else "a forced tool call needs constrained decoding"


def _output_config(value: Any) -> str | None:
    return _format((value or {}).get("format")) if isinstance(value, dict) else None


def _audio(value: Any) -> str | None:
    return "audio output is not served" if isinstance(value, list) and "audio" in value else None


_GUIDED: dict[str, Check] = {
    name: _set("constrained decoding is not served")
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
}
REFUSED: dict[str, dict[str, Check]] = {
    "chat": {
        "response_format": _format,
        "tool_choice": _chat_choice,
        "logit_bias": _set("logit biases are not served"),
        "prediction": _set("predicted outputs are not served"),
        "audio": _set("audio output is not served"),
        "modalities": _audio,
        "functions": _set("legacy functions are not rendered: send tools"),
        "function_call": _set("legacy function_call is not served: send tools"),
        **_GUIDED,
    },
    "completions": {
        "logit_bias": _set("logit biases are not served"),
        "suffix": _set("insertion (suffix) is not served"),
        "best_of": lambda v: None if v in (None, 1) else "best_of > 1 is not served: send separate calls",
        **_GUIDED,
    },
    "messages": {
        "tool_choice": _messages_choice,
        "output_config": _output_config,
        "output_format": lambda v: None if v is None else _format(v) or "output_format is not served",
    },
    "responses": {},  # responses_input.check_generation_fields
}


def audit(route: str, body: dict[str, Any]) -> tuple[str, ...]:
    """Refuse what cannot be honoured (400 naming the field); the unused fields, sorted."""
    checks = REFUSED[route]
    for name, value in body.items():
        check = checks.get(name)
        reason = check(value) if check is not None else None
        if reason is not None:
            suffix = ".format" if name == "output_config" else ""
            raise PlatformError(ErrorCode.BAD_REQUEST, f"{name}{suffix}: {reason}", field=f"{name}{suffix}")
    return tuple(sorted(name for name in body if name not in HONOURED[route]))


def tools_offered(route: str, body: dict[str, Any]) -> bool:
    """False when the client asked for no tool calls (``tool_choice`` none): tools are then not
    rendered nor parsed, which honours it."""
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else choice
    return kind != "none"

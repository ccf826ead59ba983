"""The Gemini API on the agent gateway (``v1beta/models/{m}:generateContent`` and
``:streamGenerateContent?alt=sse``), with real processes and raw HTTP shaped as Gemini CLI sends it:
thought parts, ``functionCall`` / ``functionResponse``, one token-exact segment, ``countTokens``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.protocol.gateway import segments_from_calls
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.gateway_fleet import GatewayFleet, gateway_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

THOUGHT = "<think>\nI should list them.\n</think>\n\n"
LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
RULES = {"find the files": [THOUGHT + "Let me look.\n" + LS, "There are two files."], "plain question": ["42"]}
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BODY: dict[str, Any] = {  # the shape of Gemini CLI's requests
    "systemInstruction": {"role": "user", "parts": [{"text": "You are a coding agent."}]},
    "tools": [
        {"functionDeclarations": [{"name": "bash", "description": "Run a command", "parametersJsonSchema": SCHEMA}]}
    ],
    "generationConfig": {"temperature": 0, "topP": 1, "thinkingConfig": {"includeThoughts": True}},
}


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with gateway_fleet(redis_server.url, tmp_path_factory.mktemp("gemini"), RULES) as fleet:
        yield fleet


def url(fleet: GatewayFleet, sid: str, method: str) -> str:
    return f"{fleet.proxy.url}/e/{sid}/v1beta/models/gemini-2.5-pro:{method}"


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def test_gemini_function_call_round_trip_is_one_token_exact_segment(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    ask = {"role": "user", "parts": [{"text": "Please find the files."}]}
    streamed = httpx.post(
        url(fleet, sid, "streamGenerateContent") + "?alt=sse",
        json={**BODY, "contents": [ask]},
        headers={"x-goog-api-key": token},
        timeout=30,
    )
    assert streamed.status_code == 200, streamed.text
    chunks = sse(streamed.text)
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    thought, text, call = parts
    assert thought["thought"] is True and thought["text"] == "I should list them." and thought["thoughtSignature"]
    assert text == {"text": "Let me look."}
    assert call["functionCall"]["name"] == "bash" and call["functionCall"]["args"] == {"command": "ls -la"}
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and chunks[-1]["usageMetadata"]["totalTokenCount"]

    answer = {
        "functionResponse": {"id": call["functionCall"]["id"], "name": "bash", "response": {"output": "a.txt\nb.txt"}}
    }
    follow = {**BODY, "contents": [ask, {"role": "model", "parts": parts}, {"role": "user", "parts": [answer]}]}
    prompt = {"contents": follow["contents"], "tools": BODY["tools"], "systemInstruction": BODY["systemInstruction"]}
    counted = httpx.post(url(fleet, sid, "countTokens"), json=prompt, headers={"x-goog-api-key": token})
    second = httpx.post(url(fleet, sid, "generateContent") + f"?key={token}", json=follow, timeout=30)
    assert second.status_code == 200, second.text
    assert second.json()["candidates"][0]["content"]["parts"] == [{"text": "There are two files."}]

    calls = fleet.calls(sid)
    assert [c.route for c in calls] == ["gemini", "gemini"]
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
    assert counted.json() == {"totalTokens": len(calls[1].prompt_ids)}
    assert calls[0].unused_fields == ["generationConfig.temperature", "generationConfig.thinkingConfig",
                                      "generationConfig.topP"]  # fmt: skip
    (segment,) = segments_from_calls(calls)
    tool = {"type": "function", "function": {"name": "bash", "description": "Run a command", "parameters": SCHEMA}}
    template_call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la"}}}
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Please find the files."},
        {"role": "assistant", "content": THOUGHT + "Let me look.", "tool_calls": [template_call]},
        {"role": "tool", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "There are two files."},
    ]
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render(conversation, False, [tool]))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert sum(segment.loss_mask) == len(generated)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"tools": [{"googleSearch": {}}]}, "tools.0.googleSearch"),
        ({"generationConfig": {"responseMimeType": "application/json"}}, "generationConfig.responseMimeType"),
        ({"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "toolConfig.functionCallingConfig.mode"),
        ({"contents": [{"role": "user", "parts": [{"inlineData": {"data": ""}}]}]}, "contents.0.parts.0"),
        ({"contents": []}, "contents"),
    ],
)
def test_what_cannot_be_honoured_is_400_naming_it(fleet: GatewayFleet, patch: dict[str, Any], field: str) -> None:
    sid, token = fleet.session()
    body = {"contents": [{"role": "user", "parts": [{"text": "plain question"}]}]} | patch
    response = httpx.post(url(fleet, sid, "generateContent"), json=body, headers={"x-goog-api-key": token})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field and error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
    assert fleet.calls(sid) == []


def test_the_key_is_required_and_the_array_stream_without_sse(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    body = {"contents": [{"role": "user", "parts": [{"text": "plain question"}]}]}
    assert httpx.post(url(fleet, sid, "generateContent"), json=body).status_code == 401
    streamed = httpx.post(url(fleet, sid, "streamGenerateContent"), json=body, headers={"x-goog-api-key": token})
    (only,) = streamed.json()
    assert only["candidates"][0]["content"]["parts"] == [{"text": "42"}]

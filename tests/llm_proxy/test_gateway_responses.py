"""OpenAI Responses on the agent gateway, with real processes (scripted engine, proxy, Redis) and
the real openai SDK: reasoning items, function calls, streaming, a multi-turn exchange recorded as
one token-exact segment."""

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
RULES = {
    "find the files": [THOUGHT + "Let me look.\n" + LS, "There are two files."],
    "count the files": [LS, "Two."],
    "plain question": ["forty-two"],
    "break the call": ['<tool_call>\n{"name": "bash", "arguments": \n</tool_call>'],
}
TOOL: Any = {
    "type": "function",
    "name": "bash",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}
TEMPLATE_TOOL = {
    "type": "function",
    "function": {"name": "bash", "description": TOOL["description"], "parameters": TOOL["parameters"]},
}
CODEX_LIKE: dict[str, Any] = {  # the fields Codex CLI sends besides model, input and tools
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "conversation-1",
}


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with gateway_fleet(redis_server.url, tmp_path_factory.mktemp("responses"), RULES) as fleet:
        yield fleet


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_sdk_function_call_round_trip_is_one_token_exact_segment(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    ask: Any = {"role": "user", "content": [{"type": "input_text", "text": "Please find the files."}]}
    first = client.responses.create(
        model="policy",
        instructions="You are terse.",
        input=[ask],
        tools=[TOOL],
        extra_body={**CODEX_LIKE, "client_metadata": {"session": "s"}},
    )
    thought, message, fc = first.output
    assert thought.type == "reasoning" and thought.summary[0].text == "I should list them."
    assert message.type == "message" and first.output_text == "Let me look."
    assert fc.type == "function_call" and fc.name == "bash" and json.loads(fc.arguments) == {"command": "ls -la"}
    assert first.status == "completed"
    follow: list[Any] = [
        ask,
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": fc.call_id, "output": "a.txt\nb.txt"},
    ]
    with client.responses.stream(
        model="policy", instructions="You are terse.", input=follow, tools=[TOOL], extra_body=CODEX_LIKE
    ) as stream:
        second = stream.get_final_response()
    assert second.output_text == "There are two files." and second.status == "completed"

    calls = fleet.calls(sid)
    assert [c.route for c in calls] == ["responses", "responses"]
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
    (segment,) = segments_from_calls(calls)
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Please find the files."},
        {"role": "assistant", "content": THOUGHT + "Let me look.", "tool_calls": [call("bash", {"command": "ls -la"})]},
        {"role": "tool", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "There are two files."},
    ]
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render(conversation, False, [TEMPLATE_TOOL]))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert sum(segment.loss_mask) == len(generated)


def test_streamed_function_call_events_and_previous_response_id(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    stream = client.responses.create(
        model="policy", input="Please count the files.", tools=[TOOL], stream=True, extra_body=CODEX_LIKE
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done: Any = events[-1].response
    (fc,) = done.output
    assert fc.type == "function_call" and json.loads(fc.arguments) == {"command": "ls -la"}
    assert events[4].arguments == fc.arguments

    answer: Any = {"type": "function_call_output", "call_id": fc.call_id, "output": "a.txt\nb.txt"}
    second = client.responses.create(model="policy", previous_response_id=done.id, input=[answer], tools=[TOOL])
    assert second.output_text == "Two."
    assert [c.merged for c in fleet.calls(sid)] == [False, True]

    stale = httpx.post(
        fleet.openai_url(sid) + "/responses",
        json={"model": "policy", "previous_response_id": done.id, "input": [answer]},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert stale.status_code == 400 and stale.json()["error"]["field"] == "previous_response_id"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input.0.content.0.type",
        ),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
        ({"background": True}, "background"),
        ({"max_output_tokens": "ten"}, "max_output_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_400_naming_it(fleet: GatewayFleet, patch: dict[str, Any], field: str) -> None:
    sid, token = fleet.session()
    body = {"model": "policy", "input": "plain question"} | patch
    response = httpx.post(fleet.openai_url(sid) + "/responses", json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert fleet.calls(sid) == []


def test_unused_fields_are_listed_in_the_record_and_models_report_the_window(fleet: GatewayFleet) -> None:
    sid, token = fleet.session(max_trajectory_tokens=12_000)
    auth = {"Authorization": f"Bearer {token}"}
    body = {"model": "policy", "input": "plain question", "temperature": 0.2, "x_trace": {"a": 1}, **CODEX_LIKE}
    assert httpx.post(fleet.openai_url(sid) + "/responses", json=body, headers=auth).status_code == 200
    chat = {"model": "policy", "messages": [{"role": "user", "content": "plain question"}], "seed": 3, "user": "u"}
    assert httpx.post(fleet.openai_url(sid) + "/chat/completions", json=chat, headers=auth).status_code == 200
    first, second = fleet.calls(sid)
    assert first.unused_fields == sorted({"temperature", "x_trace", *CODEX_LIKE} - {"tool_choice"})
    assert second.unused_fields == ["seed", "user"]
    (card,) = httpx.get(fleet.openai_url(sid) + "/models", headers=auth).json()["data"]
    assert card["id"] == "policy" and card["context_window"] == card["context_length"] == 12_000
    assert card["max_output_tokens"] == 400
    assert httpx.get(fleet.openai_url(sid) + "/models/policy", headers=auth).json()["context_window"] == 12_000
    assert httpx.get(fleet.openai_url(sid) + "/models/other", headers=auth).status_code == 404


@pytest.mark.parametrize(
    ("route", "patch", "field"),
    [
        ("chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
        ("chat/completions", {"tool_choice": "required"}, "tool_choice"),
        ("chat/completions", {"logit_bias": {"5": 10}}, "logit_bias"),
        ("chat/completions", {"guided_json": {"type": "object"}}, "guided_json"),
        ("messages", {"tool_choice": {"type": "any"}}, "tool_choice"),
        ("messages", {"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format"),
    ],
)
def test_generation_changing_fields_are_400_on_every_route(
    fleet: GatewayFleet, route: str, patch: dict[str, Any], field: str
) -> None:
    sid, token = fleet.session()
    body = {"model": "policy", "max_tokens": 50, "messages": [{"role": "user", "content": "plain question"}]} | patch
    response = httpx.post(f"{fleet.openai_url(sid)}/{route}", json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert fleet.calls(sid) == []


def fidelity(fleet: GatewayFleet) -> dict[str, float]:
    text = httpx.get(fleet.proxy.url + "/metrics").text
    prefix = 'rollout_gateway_tool_fidelity_total{outcome="'
    lines = [line for line in text.splitlines() if line.startswith(prefix) and 'pool="default"' in line]
    return {line[len(prefix) :].split('"')[0]: float(line.split()[-1]) for line in lines}


def test_tool_call_fidelity_per_pool_in_metrics(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    before = fidelity(fleet)
    client.responses.create(model="policy", input="Please count the files.", tools=[TOOL])  # bash: known
    shell: Any = {**TOOL, "name": "shell"}
    client.responses.create(model="policy", input="Please count the files.", tools=[shell])
    broken = client.responses.create(model="policy", input="Please break the call.", tools=[TOOL])
    assert broken.output_text.startswith("<tool_call>")  # what did not parse is kept as text
    after = fidelity(fleet)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("parsed", "unknown_tool", "malformed")}
    assert delta == {"parsed": 1, "unknown_tool": 1, "malformed": 1}

"""The agent gateway with real processes (scripted engine, proxy, Redis) and the real SDKs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.llm_proxy.gateway.sessions import SessionStore
from services.llm_proxy.gateway.tokens import Context
from services.protocol import keys
from services.protocol.gateway import GatewayCall, GatewaySession, segments_from_calls
from services.protocol.trajectory import logprobs, token_ids
from services.runtime.redis_pool import open_redis
from services.runtime.redis_server import EmbeddedRedis
from tests.llm_proxy.gateway_fleet import GatewayFleet, gateway_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
COMPACT = '<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>'  # not how tojson re-renders it
RULES = {
    "list the files": ["Let me look.\n" + LS, "There are two files."],
    "compact please": [COMPACT, "Done."],
    "summarise": ["A long answer about the task.", "Short answer after the summary."],
    "plain question": ["forty-two"],
}
BASH_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
ANTHROPIC_BASH: Any = {
    "name": "bash",
    "description": "Run a command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def fleet(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    tmp = tmp_path_factory.mktemp("gateway")
    with gateway_fleet(redis_server.url, tmp, RULES, "--gateway-routed-experts", "default=2x2") as fleet:
        yield fleet


def template_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_openai_sdk_streams_tool_calls_and_the_record_is_the_rendered_conversation(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    messages: list[Any] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Please list the files."},
    ]
    with client.chat.completions.stream(
        model="policy",
        messages=messages,
        tools=[BASH_TOOL],
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        first = stream.get_final_completion()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    assert choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    assert first.usage is not None and first.usage.completion_tokens > 0
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
    ]
    second = client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
    assert second.choices[0].message.content == "There are two files."
    calls = fleet.calls(sid)
    assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
    (segment,) = segments_from_calls(calls)
    conversation = [
        messages[0],
        messages[1],
        {"role": "assistant", "content": "Let me look.", "tool_calls": [template_call("bash", {"command": "ls -la"})]},
        {"role": "tool", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "There are two files."},
    ]
    held = [*segment.prompt_ids, *segment.response_ids]
    rendered = fleet.chat.encode(fleet.chat.render(conversation, False, [BASH_TOOL]))
    assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
    generated = [t for c in calls for t in c.output_ids]
    assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
    assert all(lp < 0 for lp, m in zip(segment.response_logprobs, segment.loss_mask, strict=True) if m)
    assert calls[1].routed_experts is not None and calls[1].routed_experts.rows == len(held) - 1


def test_anthropic_sdk_tool_use_with_bearer_and_x_api_key(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.anthropic(sid, token)
    question: Any = {"role": "user", "content": "Could you list the files?"}
    with client.messages.stream(
        model="policy",
        max_tokens=200,
        messages=[question],
        tools=[ANTHROPIC_BASH],
        system="You are terse.",
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.name == "bash" and use.input == {"command": "ls -la"}
    follow = {
        "model": "policy",
        "max_tokens": 200,
        "system": "You are terse.",
        "tools": [ANTHROPIC_BASH],
        "messages": [
            question,
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt\nb.txt"}]},
        ],
    }
    old_style = {"x-api-key": token, "anthropic-version": "2023-06-01"}  # SDKs before 2.0
    answer = httpx.post(fleet.anthropic_url(sid) + "/v1/messages", json=follow, headers=old_style, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"] == [{"type": "text", "text": "There are two files."}]
    assert answer.json()["stop_reason"] == "end_turn"
    assert [c.merged for c in fleet.calls(sid)] == [False, True]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"messages": "hi"}, "messages"),
        ({"n": 2}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"max_tokens": -1}, "max_tokens"),
    ],
)
def test_wrongly_typed_parameters_are_400_naming_the_field(
    fleet: GatewayFleet, patch: dict[str, Any], field: str
) -> None:
    sid, token = fleet.session()
    body = {"model": "policy", "messages": [{"role": "user", "content": "plain question"}]} | patch
    response = httpx.post(
        fleet.openai_url(sid) + "/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert fleet.calls(sid) == []


def test_sessions_need_their_token_and_end(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    body = {"model": "policy", "messages": [{"role": "user", "content": "plain question"}]}
    url = fleet.openai_url(sid) + "/chat/completions"
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(url, json=body).status_code == 401
    unknown = httpx.post(
        fleet.openai_url("nope") + "/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    models = httpx.get(fleet.openai_url(sid) + "/models", headers={"Authorization": f"Bearer {token}"}).json()
    assert models["data"][0]["id"] == "policy"


def test_turn_and_token_caps_are_api_errors_and_truncate_the_session(fleet: GatewayFleet) -> None:
    import openai  # here, not at the top: its import is a second of every xdist worker's collection

    sid, token = fleet.session(max_turns=1)
    client = fleet.openai(sid, token)
    ask: list[Any] = [{"role": "user", "content": "plain question"}]
    client.chat.completions.create(model="policy", messages=ask)
    with pytest.raises(openai.PermissionDeniedError, match="turn cap"):
        client.chat.completions.create(model="policy", messages=ask)
    assert fleet.state(sid)["truncated"] == "turns"
    sid, token = fleet.session(max_trajectory_tokens=16)
    client = fleet.openai(sid, token)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 16 tokens"):
        client.chat.completions.create(model="policy", messages=ask)
    assert fleet.state(sid)["truncated"] == "trajectory_tokens"


def test_logprobs_and_top_logprobs_are_answered(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    ask: list[Any] = [{"role": "user", "content": "plain question"}]
    answer = client.chat.completions.create(model="policy", messages=ask, logprobs=True, top_logprobs=3)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    content = logprobs.content
    assert "".join(t.token for t in content) == "forty-two"
    (call,) = fleet.calls(sid)
    assert [t.logprob for t in content] == pytest.approx(list(call.output_logprobs[:-1]))
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in content)


def test_a_history_rewrite_gives_two_token_exact_segments(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    first: list[Any] = [{"role": "system", "content": "Agent."}, {"role": "user", "content": "summarise the repo"}]
    reply = client.chat.completions.create(model="policy", messages=first).choices[0].message.content
    second: list[Any] = [
        {"role": "system", "content": "Agent."},
        {"role": "user", "content": "summarise: earlier you said it is long"},
    ]
    client.chat.completions.create(model="policy", messages=second)
    calls = fleet.calls(sid)
    assert [(c.segment, c.merged) for c in calls] == [(0, False), (1, False)]
    for segment, conversation, call in zip(segments_from_calls(calls), (first, second), calls, strict=True):
        assert list(segment.prompt_ids) == fleet.chat.encode(fleet.chat.render(conversation, True))
        assert list(segment.response_ids) == list(call.output_ids) and all(segment.loss_mask)
    assert reply == "A long answer about the task."


def test_recorded_ids_win_over_a_re_render_that_differs(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    messages: list[Any] = [{"role": "user", "content": "compact please"}]
    message = client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL]).choices[0].message
    assert message.tool_calls
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "x"},
    ]
    client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
    first, second = fleet.calls(sid)
    assert second.merged and second.mismatch and fleet.state(sid)["mismatches"] == "1"
    held = [*first.prompt_ids, *first.output_ids]
    assert list(second.prompt_ids[: len(held)]) == held  # the sampled bytes, not the re-rendered JSON
    assert fleet.chat.decode(first.output_ids).endswith('"arguments":{"command":"ls"}}\n</tool_call>')
    (segment,) = segments_from_calls([first, second])
    assert sum(segment.loss_mask) == len(first.output_ids) + len(second.output_ids)


def test_completions_route_takes_token_ids_and_merges(fleet: GatewayFleet) -> None:
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    prompt = fleet.chat.encode(fleet.chat.render([{"role": "user", "content": "plain question"}], True))
    done = client.completions.create(model="policy", prompt=prompt, logprobs=1)
    assert done.choices[0].text == "forty-two" and done.choices[0].logprobs is not None
    (call,) = fleet.calls(sid)
    assert list(call.prompt_ids) == prompt


def test_a_call_after_one_another_process_answered_is_planned_from_redis(
    fleet: GatewayFleet, redis_server: EmbeddedRedis
) -> None:
    """The proxy's copy of the session's last call is stale when another process answered a call of
    the session since; the agent's history then holds that reply, so the proxy reads the session
    from Redis first and the call merges into the other process's token sequence."""
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    ask: list[Any] = [{"role": "user", "content": "plain question"}]
    reply = client.chat.completions.create(model="policy", messages=ask).choices[0].message.content
    (first,) = fleet.calls(sid)
    session = GatewaySession.model_validate_json(fleet.redis.get(keys.gateway_session(sid)))  # type: ignore[arg-type]
    second: list[Any] = [*ask, {"role": "assistant", "content": reply}, {"role": "user", "content": "plain question"}]
    prompt = fleet.chat.encode(fleet.chat.render(second, True))
    output = [*fleet.chat.encode("elsewhere"), fleet.chat.eos_id]
    assert prompt[: len(first.prompt_ids) + len(first.output_ids)] == [*first.prompt_ids, *first.output_ids]
    context = Context(messages=second, reply={"role": "assistant", "content": "elsewhere"}, tools=None, segment=0,
                      held=[], ended_with_eos=True)  # fmt: skip
    asyncio.run(_record_elsewhere(redis_server.url, session, prompt, output, context, merged=True))
    replanned = _replanned(fleet)
    third = [*second, {"role": "assistant", "content": "elsewhere"}, {"role": "user", "content": "plain question"}]
    client.chat.completions.create(model="policy", messages=third)
    _, other, last = fleet.calls(sid)
    assert (other.index, last.index) == (1, 2) and (last.merged, last.segment) == (True, 0)
    assert list(last.prompt_ids) == fleet.chat.encode(fleet.chat.render(third, True))
    assert _replanned(fleet) == replanned
    (segment,) = segments_from_calls(fleet.calls(sid))
    assert segment.calls == [0, 1, 2]


def test_a_call_planned_from_a_stale_copy_is_recorded_as_a_new_segment(
    fleet: GatewayFleet, redis_server: EmbeddedRedis
) -> None:
    """When the copy looks current but another process recorded a call meanwhile (one whose answer
    never reached the agent), the record finds the log moved on: the call is recorded at its end as
    a new segment, with the ids it was generated from, and counted."""
    sid, token = fleet.session()
    client = fleet.openai(sid, token)
    ask: list[Any] = [{"role": "user", "content": "plain question"}]
    reply = client.chat.completions.create(model="policy", messages=ask).choices[0].message.content
    session = GatewaySession.model_validate_json(fleet.redis.get(keys.gateway_session(sid)))  # type: ignore[arg-type]
    context = Context(messages=[{"role": "user", "content": "other"}], reply={"role": "assistant", "content": "x"},
                      tools=None, segment=1, held=[], ended_with_eos=True)  # fmt: skip
    asyncio.run(_record_elsewhere(redis_server.url, session, [5, 6], [7], context, merged=False))
    replanned = _replanned(fleet)
    follow: list[Any] = [*ask, {"role": "assistant", "content": reply}, {"role": "user", "content": "plain question"}]
    answer = client.chat.completions.create(model="policy", messages=follow)
    first, other, last = fleet.calls(sid)
    assert (first.index, other.index, last.index) == (0, 1, 2) and first.segment == 0
    assert (last.merged, last.segment) == (False, 2)  # the log moved past the proxy's copy
    assert list(last.prompt_ids) == fleet.chat.encode(fleet.chat.render(follow, True))
    metadata: Any = answer.metadata  # the answer is built again with the index it was recorded at
    assert answer.id.endswith("-2") and (metadata["call_index"], metadata["segment"]) == (2, 2)
    assert _replanned(fleet) == replanned + 1
    assert [s.calls for s in segments_from_calls([first, other, last])] == [[0], [1], [2]]


def _replanned(fleet: GatewayFleet) -> float:
    metrics = httpx.get(fleet.proxy.url + "/metrics").text
    found = [line.split()[-1] for line in metrics.splitlines() if line.startswith("rollout_gateway_replanned_total ")]
    return float(found[0]) if found else 0.0


async def _record_elsewhere(
    url: str, session: GatewaySession, prompt: list[int], output: list[int], context: Context, *, merged: bool
) -> None:
    store = SessionStore(open_redis(url))
    try:
        view = await store.read(session)
        call = GatewayCall(index=view.index, segment=context.segment, prompt_ids=token_ids(prompt),
                           output_ids=token_ids(output), output_logprobs=logprobs([0.0] * len(output)),
                           finish_reason="stop", merged=merged)  # fmt: skip
        assert (await store.record(session, call, context, mismatch=False)).outcome == "recorded"
    finally:
        store.close()
        await store.redis.aclose(close_connection_pool=True)

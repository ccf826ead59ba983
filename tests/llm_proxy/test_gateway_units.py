"""The gateway's pure parts: tool-call parsers, the agent spec, the session log's segments."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from services.llm_proxy.gateway.parsers import parse_tool_calls, render_call
from services.protocol.agents import AgentSpec, BashAgent, CommandAgent
from services.protocol.gateway import GatewayCall, segments_from_calls
from services.protocol.trajectory import logprobs, token_ids


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder"])
def test_parsers_read_their_format(parser: str) -> None:
    text = "Looking.\n" + render_call("bash", {"command": "ls -la", "n": 3}, parser)
    reply = parse_tool_calls(text, parser)
    assert reply.content == "Looking." and reply.calls == [("bash", {"command": "ls -la", "n": 3})]
    assert reply.errors == []


def test_malformed_markup_is_an_error_and_keeps_the_text() -> None:
    for text in (
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"name": "bash"',
        '<tool_call>["x"]</tool_call>',
    ):
        reply = parse_tool_calls(text, "hermes")
        assert reply.calls == [] and len(reply.errors) == 1 and reply.content == text
    assert parse_tool_calls("no calls here", "hermes").errors == []


def test_a_mini_swe_agent_config_is_a_bash_agent() -> None:
    config = {
        "kind": "bash",
        "agent": {
            "system_template": "SYS {{system}}",
            "instance_template": "Do {{task}}",
            "step_limit": 5,
            "cost_limit": 3.0,
        },
        "model": {
            "observation_template": "{{output.output}}",
            "model_name": "x",
            "action_regex": "```sh\\n(.*?)\\n```",
        },
        "environment": {"environment_class": "docker"},
    }
    agent = TypeAdapter(AgentSpec).validate_python(config)
    assert isinstance(agent, BashAgent) and agent.step_limit == 5 and agent.action_regex == "```sh\\n(.*?)\\n```"
    assert agent.instance_template == "Do {{task}}" and agent.observation_template == "{{output.output}}"
    with pytest.raises(ValidationError):
        TypeAdapter(AgentSpec).validate_python({"kind": "command", "argv": []})
    assert isinstance(TypeAdapter(AgentSpec).validate_python({"kind": "command", "argv": ["a"]}), CommandAgent)


def _call(index: int, segment: int, prompt: list[int], output: list[int]) -> GatewayCall:
    return GatewayCall(
        index=index,
        segment=segment,
        prompt_ids=token_ids(prompt),
        output_ids=token_ids(output),
        output_logprobs=logprobs([-0.5] * len(output)),
        finish_reason="stop",
    )


def test_segments_from_calls_merge_and_split() -> None:
    calls = [_call(0, 0, [1, 2], [3]), _call(1, 0, [1, 2, 3, 9], [4, 5]), _call(2, 1, [7], [8])]
    first, second = segments_from_calls(calls)
    assert list(first.prompt_ids) == [1, 2] and list(first.response_ids) == [3, 9, 4, 5]
    assert list(first.loss_mask) == [1, 0, 1, 1] and list(first.response_logprobs) == [-0.5, 0.0, -0.5, -0.5]
    assert list(second.prompt_ids) == [7] and list(second.loss_mask) == [1] and first.calls == [0, 1]
    with pytest.raises(ValueError, match="does not extend"):
        segments_from_calls([_call(0, 0, [1, 2], [3]), _call(1, 0, [1, 5], [4])])

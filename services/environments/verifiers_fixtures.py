"""Small verifiers environments for the tests and ``rollout bench envs``, written against the
package's own classes (``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``, ``Rubric``, ``XMLParser``),
the replies the scripted engine gives for each row, turn by turn, and ``package_reward``: the
reward the package itself gives those replies (its own ``rollout`` with a client that answers
them, then its rubric's ``score_rollout``).

``load_environment(kind=...)`` follows verifiers' convention for an environment module, so the
worker loads these with ``verifiers.load_environment("services.environments.verifiers_fixtures",
kind=...)`` like any installed environment package.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

ENV_ID = "services.environments.verifiers_fixtures"
SYSTEM = "Answer inside <answer>...</answer>."


def _single(vf: Any, dataset: Any) -> Any:
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion: Any, answer: str, **_: Any) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.25], parser=parser)
    return vf.SingleTurnEnv(dataset=dataset, system_prompt=SYSTEM, parser=parser, rubric=rubric)


def _multi(vf: Any, dataset: Any) -> Any:
    class GuessEnv(vf.MultiTurnEnv):  # type: ignore[misc]
        """Guess the number: the environment answers "higher" / "lower" until the guess is right."""

        async def env_response(self, messages: Any, state: Any, **_: Any) -> Any:
            guess = _number(messages[-1]["content"])
            target = int(state["answer"])
            if guess == target:
                state["final_env_response"] = [{"role": "user", "content": "Correct!"}]
                return state["final_env_response"]
            hint = "not a number" if guess is None else ("higher" if guess < target else "lower")
            return [{"role": "user", "content": f"{hint}; guess again."}]

    def solved(completion: Any, answer: str, **_: Any) -> float:
        guesses = [_number(m["content"]) for m in completion if m["role"] == "assistant"]
        return max(0.0, 1.0 - 0.25 * (len(guesses) - 1)) if guesses and guesses[-1] == int(answer) else 0.0

    return GuessEnv(dataset=dataset, system_prompt="Guess the number from 1 to 10.", max_turns=4,
                    rubric=vf.Rubric(funcs=[solved]))  # fmt: skip


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


def _tool(vf: Any, dataset: Any) -> Any:
    def correct_answer(completion: Any, answer: str, **_: Any) -> float:
        return 1.0 if _number(str(completion[-1].get("content") or "")) == int(answer) else 0.0

    return vf.ToolEnv(dataset=dataset, tools=[add, multiply], max_turns=4, system_prompt="Use the tools.",
                      rubric=vf.Rubric(funcs=[correct_answer]))  # fmt: skip


def _number(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


QUESTIONS: dict[str, list[dict[str, str]]] = {
    "single": [{"question": "VF-SINGLE-RIGHT: What is 6 times 7?", "answer": "42"},
               {"question": "VF-SINGLE-WRONG: What is 6 times 7?", "answer": "42"}],
    "multi": [{"question": "VF-MULTI: I am thinking of a number.", "answer": "7"}],
    "tool": [{"question": "VF-TOOL: What is (2 + 3) times 4?", "answer": "20"}],
}  # fmt: skip
BUILDERS = {"single": _single, "multi": _multi, "tool": _tool}


def load_environment(kind: str = "single") -> Any:
    import verifiers as vf
    from datasets import Dataset

    return BUILDERS[kind](vf, Dataset.from_list(QUESTIONS[kind]))


def tool_call(name: str, **arguments: int) -> str:
    """A reply holding one tool call in the chat template's (hermes) markup, which the gateway parses."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


REPLIES: dict[str, list[str]] = {
    "VF-SINGLE-RIGHT": ["6 * 7 = 42. <answer>42</answer>"],
    "VF-SINGLE-WRONG": ["<answer>41</answer>"],
    "VF-MULTI": ["5", "9", "7"],  # lower bound, upper bound, right: 1 - 2 * 0.25
    "VF-TOOL": [tool_call("add", a=2, b=3), tool_call("multiply", a=5, b=4), "The answer is 20."],
}


class ScriptedChat:
    """An ``AsyncOpenAI`` stand-in for the package's own rollout: ``chat.completions.create`` answers
    the replies in order, with tool calls parsed from the hermes markup as the gateway does."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.chat = self
        self.completions = self

    async def create(self, **_: Any) -> Any:
        from openai.types.chat import ChatCompletion

        text = self.replies.pop(0)
        calls = [json.loads(m) for m in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)]
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else text}
        if calls:
            message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
                "name": c["name"], "arguments": json.dumps(c["arguments"])}} for i, c in enumerate(calls)]  # fmt: skip
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        doc = {"id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()), "model": "policy"}
        return ChatCompletion.model_validate({**doc, "choices": [choice]})


async def package_reward(kind: str, marker: str) -> tuple[float, int]:
    """The reward verifiers itself gives the row's replies (its ``rollout`` and rubric), and the LLM turns."""
    env = load_environment(kind)
    row = next(r for r in env.get_dataset() if marker in r["prompt"][-1]["content"])
    state = await env.rollout(row, ScriptedChat(REPLIES[marker]), "policy")
    await env.rubric.score_rollout(state)
    return float(state["reward"]), len(state["trajectory"])

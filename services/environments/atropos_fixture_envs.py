"""Two small Atropos environments written against the package's own classes (``BaseEnv``,
``BaseEnvConfig``, ``ScoredDataGroup``, ``tokenize_for_trainer``) as its example environments are
(gsm8k's: ``get_next_item`` / ``collect_trajectories`` / ``score``, 1.0 for the right answer and -1.0
otherwise): ``Arithmetic`` (one LLM call per item) and ``ArithmeticRetry`` (a wrong first answer gets
one "try again" turn; right at the second try scores 0.5). Items and replies: atropos_fixtures.py.
"""

from __future__ import annotations

import re
from typing import Any

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import ServerBaseline
from atroposlib.envs.server_handling.server_harness import create_chat_completion
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

from services.environments.atropos_fixtures import ITEMS, SYSTEM


def _answer(text: str) -> str | None:
    found = re.findall(r"####\s*(-?\d+)", text)
    return found[-1] if found else None


class Arithmetic(BaseEnv):  # type: ignore[misc]
    name = "rollout-arithmetic"
    items = ITEMS["Arithmetic"]

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline]:
        return BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=512), ServerBaseline()

    async def setup(self) -> None:
        self.iter = 0

    async def get_next_item(self) -> dict[str, str]:
        item = self.items[self.iter % len(self.items)]
        self.iter += 1
        return item

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[ScoredDataGroup | None, list[Any]]:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": item["question"]}]
        completions = await self.server.chat_completion(messages=messages, n=self.config.group_size,
                                                        max_tokens=self.config.max_token_length)  # fmt: skip
        group = []
        for choice in completions.choices:
            chat = [*messages, {"role": "assistant", "content": choice.message.content}]
            group.append((chat, item["answer"], choice.finish_reason, 1.0))
        return await self.score(group), []

    async def score(self, rollout_group_data: list[Any]) -> ScoredDataGroup | None:
        scores = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for chat, answer, finish_reason, weight in rollout_group_data:
            out = tokenize_for_trainer(self.tokenizer, chat, finish_reason=finish_reason)
            scores["tokens"].append(out["tokens"])
            scores["masks"].append(out["masks"])
            scores["scores"].append(weight if _answer(chat[-1]["content"]) == answer else -1.0)
        if self.config.ensure_scores_are_not_same and len(set(scores["scores"])) == 1:
            return None  # no signal in the group: the package drops it
        return scores

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None


class ArithmeticRetry(Arithmetic):
    name = "rollout-arithmetic-retry"
    items = ITEMS["ArithmeticRetry"]

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[ScoredDataGroup | None, list[Any]]:
        chat: list[dict[str, str]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": item["question"]},
        ]
        weight, finish_reason = 1.0, "stop"
        for attempt in range(2):
            completion = await self.server.chat_completion(messages=chat, n=1, max_tokens=self.config.max_token_length)
            choice = completion.choices[0]
            chat = [*chat, {"role": "assistant", "content": choice.message.content}]
            weight, finish_reason = 1.0 - 0.5 * attempt, choice.finish_reason
            if _answer(choice.message.content) == item["answer"] or attempt == 1:
                break
            chat.append({"role": "user", "content": "That is wrong; try again."})
        return await self.score([(chat, item["answer"], finish_reason, weight)]), []


class Scripted:
    """A server for the package's own run: answers the replies in order (the package's ``create_chat_completion``)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def chat_completion(self, **kwargs: Any) -> Any:
        return create_chat_completion(self.replies.pop(0), n=kwargs.get("n", 1))

"""Atropos fixtures for the tests and ``rollout bench envs``: the items of the two small environments in
``atropos_fixture_envs.py`` (written against the package's own classes), the replies the scripted
engine gives for each item, turn by turn, and ``package_reward``: the score the package itself gives
those replies (the environment's own ``collect_trajectories`` with a server answering them through
the package's ``create_chat_completion``). Nothing here imports the package until it is used.
"""

from __future__ import annotations

MODULE = "services.environments.atropos_fixture_envs"  # the environments' module, as tasks name it
SYSTEM = "Answer with the number after '#### '."
ITEMS: dict[str, list[dict[str, str]]] = {  # environment class -> its items
    "Arithmetic": [{"question": "ATROPOS-RIGHT: What is 6 times 7?", "answer": "42"},
                   {"question": "ATROPOS-WRONG: What is 6 times 7?", "answer": "42"}],
    "ArithmeticRetry": [{"question": "ATROPOS-RETRY: What is 9 plus 8?", "answer": "17"}],
}  # fmt: skip
REPLIES: dict[str, list[str]] = {
    "ATROPOS-RIGHT": ["6 * 7 = 42\n#### 42"],
    "ATROPOS-WRONG": ["#### 41"],
    "ATROPOS-RETRY": ["#### 16", "9 + 8 = 17\n#### 17"],
}


async def package_reward(name: str, item: dict[str, str], tokenizer: str) -> float:
    """The score the environment itself gives the item's replies (a group of one, as the platform runs it)."""
    from atroposlib.envs.server_handling.server_baseline import ServerBaseline

    from services.environments import atropos_fixture_envs

    cls = getattr(atropos_fixture_envs, name)
    config, _ = cls.config_init()
    config = config.model_copy(update={"group_size": 1, "ensure_scores_are_not_same": False, "use_wandb": False,
                                       "tokenizer_name": tokenizer})  # fmt: skip
    env = cls(config, ServerBaseline(), testing=True)
    await env.setup()
    env.server = atropos_fixture_envs.Scripted(REPLIES[item["question"].split(":")[0]])
    group, _ = await env.collect_trajectories(item)
    assert group is not None, "the environment dropped the group"
    return float(group["scores"][0])

"""SkyRL dataset rows for the tests and ``rollout bench envs`` (SkyRL's own row format: ``prompt``,
``env_class``, ``reward_spec``, ``extra_info``), the replies the scripted engine gives for each,
turn by turn, and the reward the package itself gives those replies."""

from __future__ import annotations

from typing import Any


def row(marker: str, env_class: str, answer: str, **extra: Any) -> dict[str, Any]:
    question = f"{marker}: Tom has 6 boxes of 7 apples. How many apples does he have?"
    return {
        "data_source": "tests", "env_class": env_class,
        "prompt": [{"role": "system", "content": "Think step by step; end with '#### ANSWER'."},
                   {"role": "user", "content": question}],
        "reward_spec": {"method": "rule", "ground_truth": answer},
        "extra_info": {"id": marker.lower(), **extra},
    }  # fmt: skip


ROWS = [
    row("SKYRL-RIGHT", "gsm8k", "42"),  # one step, correct: 1.0
    row("SKYRL-WRONG", "gsm8k", "42"),  # one step, wrong answer: 0.0
    row("SKYRL-MULTI", "gsm8k_multi_turn", "42", max_turns=3),  # a format-only turn, then the answer
]
REPLIES: dict[str, list[str]] = {
    "SKYRL-RIGHT": ["6 boxes times 7 apples is 42.\n#### 42"],
    "SKYRL-WRONG": ["6 times 7 is 41.\n#### 41"],
    "SKYRL-MULTI": ["A first guess.\n#### 40", "6 * 7 = 42.\n#### 42"],
}


def package_reward(data: dict[str, Any], replies: list[str]) -> tuple[float, int]:
    """The reward SkyRL-Gym itself gives these replies (its own make / init / step), and the steps taken."""
    import skyrl_gym  # needed only where the fixtures run

    extras = {k: v for k, v in data.items() if k not in ("prompt", "env_class")}
    env = skyrl_gym.make(data["env_class"], env_config={}, extras=extras)
    env.init(data["prompt"])
    rewards = []
    for reply in replies:
        out = env.step(reply)
        rewards.append(float(out["reward"]))
        if out["done"]:
            break
    env.close()
    return sum(rewards), len(rewards)

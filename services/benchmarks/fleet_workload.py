"""The field-shaped workload (../shared/workloads/field-shaped.md) as scripted-engine rules.

Every episode class is one rule of the scripted engine: its replies are the bash commands of
each turn (a ``sleep`` of the command's duration), each with the LLM latency of that turn, and
the last one submits when the episode succeeds. All durations are divided by ``time_scale``.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
TURN_CAP = 80
CAP_SHARE = 0.84  # episodes that run to the turn cap
SUCCESS_TURNS_MEDIAN, SUCCESS_TURNS_SIGMA = 8.0, 0.8
LLM_MEDIAN_S, LLM_SIGMA = 3.5, 0.69  # mean ~4.4 s
COMMAND_MEDIAN_S, COMMAND_SIGMA = 0.4, 0.9  # mean ~0.6 s, ~1% over 30 s... in the far tail
SETUP_S = 15.0
REWARD_MEDIAN_S, REWARD_SIGMA = 25.0, 0.5
SPEED_SIGMA = 0.3  # per-class speed factor (same task, attempts differ up to 2.5x)


@dataclass(frozen=True, slots=True)
class EpisodeClass:
    name: str  # matched in the prompt: "CLASS-007|"
    turns: int
    succeeds: bool
    llm_s: list[float]  # per turn, already scaled
    command_s: list[float]
    reward_s: float
    setup_s: float

    @property
    def duration_s(self) -> float:
        return sum(self.llm_s) + sum(self.command_s) + self.reward_s + self.setup_s

    def replies(self) -> list[dict[str, Any]]:
        out = []
        for turn in range(self.turns):
            last = turn == self.turns - 1
            text = (
                SUBMIT
                if last and self.succeeds
                else f"THOUGHT: step {turn}\n```bash\nsleep {self.command_s[turn]:.3f}\n```"
            )
            out.append({"text": text, "latency_s": round(self.llm_s[turn], 4)})
        return out


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def sample_class(
    rng: random.Random, index: int, time_scale: float, prefix: str = "CLASS", turns: int | None = None
) -> EpisodeClass:
    """One class of the field's shape; ``turns`` set: an episode of that many turns that succeeds
    (the capacity bench's short episodes, which lease a sandbox per turn or two)."""
    succeeds = rng.random() >= CAP_SHARE or turns is not None
    if turns is None:
        turns = TURN_CAP
        if succeeds:
            turns = int(min(TURN_CAP, max(1, round(_lognormal(rng, SUCCESS_TURNS_MEDIAN, SUCCESS_TURNS_SIGMA)))))
    speed = math.exp(rng.gauss(0.0, SPEED_SIGMA))
    llm = [_lognormal(rng, LLM_MEDIAN_S, LLM_SIGMA) * (1 + t / TURN_CAP) * speed / time_scale for t in range(turns)]
    commands = [_lognormal(rng, COMMAND_MEDIAN_S, COMMAND_SIGMA) * speed / time_scale for _ in range(turns)]
    return EpisodeClass(
        name=f"{prefix}-{index:03d}|",
        turns=turns,
        succeeds=succeeds,
        llm_s=llm,
        command_s=commands,
        reward_s=_lognormal(rng, REWARD_MEDIAN_S, REWARD_SIGMA) / time_scale,
        setup_s=SETUP_S / time_scale,
    )


def sample_classes(
    count: int, time_scale: float, seed: int, prefix: str = "CLASS", turns: int | None = None
) -> list[EpisodeClass]:
    rng = random.Random(seed)
    return [sample_class(rng, i, time_scale, prefix, turns) for i in range(count)]


def write_script(path: Path, classes: list[EpisodeClass]) -> Path:
    doc = {"rules": [{"match": c.name, "replies": c.replies()} for c in classes], "default": SUBMIT}
    path.write_text(json.dumps(doc))
    return path


def task_for(episode: EpisodeClass, task_id: str) -> dict[str, Any]:
    """A platform ``Task`` (as JSON) that plays ``episode``."""
    return {
        "id": task_id,
        "prompt": f"Benchmark episode {episode.name} follow the script.",
        "sandbox": {"setup": [f"sleep {episode.setup_s:.3f}"]},
        "reward": {"command": f"sleep {episode.reward_s:.3f}; {'true' if episode.succeeds else 'false'}"},
    }


def mean_turns(classes: list[EpisodeClass]) -> float:
    return sum(c.turns for c in classes) / len(classes)

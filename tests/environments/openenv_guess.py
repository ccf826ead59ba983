"""A small OpenEnv environment for the tests, written against the package's own server classes:
guess a number. Each wrong guess costs 0.1 and says "higher" or "lower"; the right one scores 1.0
and ends the episode. Served by ``uvicorn tests.environments.openenv_guess:app``."""

from __future__ import annotations

import re
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):  # type: ignore[misc]
    message: str = Field(..., description="the reply; its last integer is the guess")


class GuessObservation(Observation):  # type: ignore[misc]
    feedback: str = Field(default="")


class GuessEnvironment(Environment):  # type: ignore[misc]  # the package is untyped
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, target: int = 7,
              **kwargs: Any) -> GuessObservation:  # fmt: skip
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.target = target
        return GuessObservation(feedback="Guess my number between 1 and 10.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        numbers = re.findall(r"-?\d+", action.message)
        if not numbers:
            return GuessObservation(feedback="Say a number.", done=False, reward=-0.1)
        guess = int(numbers[-1])
        if guess == self.target:
            return GuessObservation(feedback="Right.", done=True, reward=1.0)
        hint = "higher" if guess < self.target else "lower"
        return GuessObservation(feedback=f"{guess} is wrong: go {hint}.", done=False, reward=-0.1)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16)

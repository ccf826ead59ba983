"""The demo's task family: shell questions about a file of numbers, answered by running one command.

Each task writes a file of random numbers into the sandbox (``nums_qxw.dat``: 4 to 8 distinct
integers from 10 to 99, one per line) and asks, in words, for one of four facts about it: how
many lines it has, the sum, the largest or the smallest number. The answer goes into
``answer.txt``; the reward command compares it with the value computed when the task was made.

Why the sandbox is needed and nothing can be guessed: the numbers are random and only in the
sandbox, so the answer exists only by running a command there. The four answers of one file are
always different (the count is at most 8, every number at least 10, the sum above the largest),
so a wrong operation always fails.

Why a tiny model can learn it in minutes: one command solves a task (``cat *.dat | wc -l >
answer.txt``, ``awk '{s+=$1} END{print s}' *.dat > answer.txt``, ``sort -n *.dat | tail -1 >
answer.txt``, ``sort -n *.dat | head -1 > answer.txt``), ending with ``&& echo <submit marker>``
so that the episode is one turn. The policy has to map the phrase to one of four operations; the
file is the sandbox's only ``.dat`` file, so a glob names it. (Copying the random file name from
the prompt instead was measured first: after 150 SFT steps of 16 demonstrations the 2-layer,
64-wide model copied it in 0 of 64 held-out prompts. Learning to copy needs more compute than a
2-core CPU gives a demo.) Train and held-out problems share no file name and no file: every
held-out prompt is new text and every held-out answer a new value.

The teacher is imperfect on purpose (:func:`demonstration`): it picks the right operation with
probability ``teacher_accuracy`` and another one otherwise, like demonstrations from a weaker
model. Fine-tuning on them teaches the format and leaves the operation choice uncertain: that is
the headroom reinforcement learning has to close, from rewards alone.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from services.protocol import RewardSpec, SandboxSpec, Task
from services.protocol.agents import BashAgent

OPERATIONS: dict[str, tuple[tuple[str, ...], str]] = {
    # name: (phrasings of the question ({f}: the file), the command)
    "lines": (("Count the lines in {f}.", "How many lines does {f} have?"), "cat *.dat | wc -l > answer.txt"),
    "sum": (("Add up the numbers in {f}.", "What is the sum of the numbers in {f}?"),
            "awk '{s+=$1} END{print s}' *.dat > answer.txt"),
    "max": (("Find the largest number in {f}.", "What is the biggest number in {f}?"),
            "sort -n *.dat | tail -1 > answer.txt"),
    "min": (("Find the smallest number in {f}.", "What is the lowest number in {f}?"),
            "sort -n *.dat | head -1 > answer.txt"),
}  # fmt: skip
STEMS = ("nums", "data", "values", "list", "log")

# The agent of every task: the built-in bash loop with a short system prompt, the bare task as the
# user message and a short submit marker. Every token of an episode is a byte for this model: the
# default system prompt (~750 bytes) and marker (37 bytes) would be most of the compute of an episode
# and most of the chances to get the format wrong.
MARKER = "DONE"
SYSTEM_PROMPT = f"Reply with ONE command in a ```bash block, ending with && echo {MARKER} to submit."
AGENT = BashAgent(system_template=SYSTEM_PROMPT, instance_template="{{task}}", submit_marker=MARKER)


@dataclass(frozen=True)
class Problem:
    """One instance: a file, its numbers and the operation asked for."""

    file: str
    numbers: tuple[int, ...]
    operation: str
    phrasing: int

    @property
    def answer(self) -> int:
        values = {"lines": len(self.numbers), "sum": sum(self.numbers), "max": max(self.numbers),
                  "min": min(self.numbers)}  # fmt: skip
        return values[self.operation]

    @property
    def prompt(self) -> str:
        question = OPERATIONS[self.operation][0][self.phrasing].format(f=self.file)
        return f"{question} Write the answer into answer.txt."

    @property
    def task_id(self) -> str:
        return f"{self.operation}-{self.file.removesuffix('.dat')}"

    def task(self) -> Task:
        content = "".join(f"{n}\n" for n in self.numbers)
        check = f'[ "$(tr -d "[:space:]" < answer.txt)" = "{self.answer}" ]'
        return Task(
            id=self.task_id, prompt=self.prompt, agent=AGENT,
            sandbox=SandboxSpec(files={self.file: content}),
            reward=RewardSpec(command=check, timeout_s=10),
            metadata={"family": "shell-numbers", "operation": self.operation},
        )  # fmt: skip


def reply(problem: Problem, operation: str) -> str:
    """The agent's reply that applies ``operation`` to the problem's file."""
    return f"```bash\n{OPERATIONS[operation][1]} && echo {MARKER}\n```"


def demonstration(problem: Problem, rng: random.Random, teacher_accuracy: float) -> str:
    """The imperfect teacher's reply: the right operation with probability ``teacher_accuracy``."""
    if rng.random() < teacher_accuracy:
        return reply(problem, problem.operation)
    return reply(problem, rng.choice([op for op in OPERATIONS if op != problem.operation]))


def _file_name(rng: random.Random) -> str:
    return f"{rng.choice(STEMS)}_{''.join(rng.choices(string.ascii_lowercase, k=3))}.dat"


def _problem(rng: random.Random, file: str) -> Problem:
    numbers = tuple(rng.sample(range(10, 100), rng.randint(4, 8)))
    operation = rng.choice(list(OPERATIONS))
    return Problem(file, numbers, operation, rng.randrange(len(OPERATIONS[operation][0])))


def splits(seed: int, train: int, heldout: int) -> tuple[list[Problem], list[Problem]]:
    """``train`` and ``heldout`` problems with distinct file names; no held-out file name is ever trained on."""
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < train + heldout:
        name = _file_name(rng)
        if name not in seen:
            seen.add(name)
            names.append(name)
    problems = [_problem(rng, name) for name in names]
    return problems[:train], problems[train:]

"""The recipe of ``rollout images build``: a Dockerfile-like file (a subset of Dockerfile's
instructions) or the same steps given as command-line flags.

    FROM <image>          an image source path (OCI layout, docker save / OCI tar, root directory),
                          a name in the image store, or ``mmdebstrap`` (Debian 12 minbase with
                          python3, git and patch, made from Debian's packages: services/taskbuild/base.py)
    COPY <src> <dest>     a file or directory of the build context into the image
    RUN <command>         a shell command, run in a sandbox over the image so far
    ENV <key>=<value> ... (or ``ENV <key> <value>``) for the following RUNs and the image
    WORKDIR <path>        where the following RUNs start (created), and the image's WorkingDir
    USER <user>           the image's User (RUNs run as the base image's user)

Lines ending in ``\\`` continue on the next; ``#`` starts a comment line.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["copy", "run", "env", "workdir", "user"]
INSTRUCTIONS = ("FROM", "COPY", "RUN", "ENV", "WORKDIR", "USER")


class RecipeError(ValueError):
    """A recipe this builder cannot follow (the message names the line)."""


@dataclass(frozen=True, slots=True)
class Step:
    kind: Kind
    args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ImageRecipe:
    base: str
    steps: tuple[Step, ...] = field(default_factory=tuple)


def parse(text: str) -> ImageRecipe:
    """The recipe in ``text`` (see the module docstring)."""
    base = ""
    steps: list[Step] = []
    for number, line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword not in INSTRUCTIONS:
            raise RecipeError(f"line {number}: unknown instruction {keyword!r} (known: {', '.join(INSTRUCTIONS)})")
        if not rest:
            raise RecipeError(f"line {number}: {keyword} needs an argument")
        if keyword == "FROM":
            if base or steps:
                raise RecipeError(f"line {number}: one FROM, first (multi-stage builds are not supported)")
            base = rest
        elif not base:
            raise RecipeError(f"line {number}: the recipe must start with FROM")
        else:
            steps.append(_step(number, keyword, rest))
    if not base:
        raise RecipeError("the recipe has no FROM")
    return ImageRecipe(base, tuple(steps))


def from_flags(
    base: str, copies: list[str], runs: list[str], env: list[str], workdir: str | None, user: str | None
) -> ImageRecipe:
    """The recipe of ``--from``, ``--copy SRC:DEST``, ``--env K=V``, ``--workdir``, ``--run``
    (``--user``): copies first, then the environment and workdir, then the commands."""
    steps = []
    for item in copies:
        src, sep, dest = item.rpartition(":")
        if not sep or not src or not dest:
            raise RecipeError(f"--copy {item!r}: expected SRC:DEST")
        steps.append(Step("copy", (src, dest)))
    steps += [_env_step(0, item) for item in env]
    if workdir:
        steps.append(Step("workdir", (workdir,)))
    steps += [Step("run", (command,)) for command in runs]
    if user:
        steps.append(Step("user", (user,)))
    return ImageRecipe(base, tuple(steps))


def _step(number: int, keyword: str, rest: str) -> Step:
    if keyword == "RUN":
        return Step("run", (rest,))
    if keyword == "ENV":
        return _env_step(number, rest)
    words = shlex.split(rest)
    if keyword == "COPY":
        if len(words) != 2 or words[0].startswith("--"):
            raise RecipeError(f"line {number}: COPY takes one source and one destination (no flags)")
        return Step("copy", (words[0], words[1]))
    if len(words) != 1:
        raise RecipeError(f"line {number}: {keyword} takes one argument")
    return Step("workdir" if keyword == "WORKDIR" else "user", (words[0],))


def _env_step(number: int, rest: str) -> Step:
    words = shlex.split(rest)
    if "=" not in words[0]:  # ENV KEY VALUE...
        return Step("env", (f"{words[0]}={' '.join(words[1:])}",))
    if not all("=" in word and not word.startswith("=") for word in words):
        raise RecipeError(f"line {number}: ENV takes KEY=VALUE pairs")
    return Step("env", tuple(words))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((start, pending + stripped))
        pending = ""
    if pending:
        lines.append((start, pending.strip()))
    return lines

"""A real CLI harness (from npm, unmodified, installed once per machine under
``~/.cache/rollout-harnesses``; ``services/benchmarks/harnesses.py`` says how each is configured and
started) against a gateway session on this host: the set-up and the checks the Codex, Claude Code
and Gemini CLI tests share. The scripted engine answers the task with a call of the harness's own
shell tool (``ls``) in the pool's Hermes format, then the answer; each run must finish with the
answer in 2 calls recorded as one token-exact segment. Where npm is missing or cannot install the
package in time (no registry), the test skips, saying why."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.benchmarks.harnesses import HARNESSES, Episode, Harness
from services.benchmarks.npm_harness import HarnessUnavailable
from services.protocol import keys
from services.protocol.gateway import GatewayCall, segments_from_calls
from tests.llm_proxy.gateway_fleet import GatewayFleet, gateway_fleet

TASK = "List the files here."
ANSWER = "There are two files."


@dataclass
class CliRun:
    """What one run left in the gateway: its calls and the conversation it sent last."""

    calls: list[GatewayCall]
    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    tools: list[dict[str, Any]]


@dataclass
class Cli:
    harness: Harness
    exe: str
    fleet: GatewayFleet

    def run(self, tmp_path: Path) -> CliRun:
        """The harness on the task in a fresh directory holding a.txt and b.txt, with its own session."""
        fleet = self.fleet
        sid, token = fleet.session(max_trajectory_tokens=500_000)  # instructions and tools: ~40-50 KB
        work = tmp_path / "work"
        work.mkdir()
        (work / "a.txt").write_text("a")
        (work / "b.txt").write_text("b")
        spec = self.harness.launch(self.exe, Episode(fleet.proxy.url, sid, token, tmp_path, work, TASK))
        run = subprocess.run(spec.argv, env={**os.environ, **spec.env}, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=90)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip().endswith(ANSWER)

        calls = fleet.calls(sid)
        assert [c.route for c in calls] == [self.harness.route] * 2 and [c.tool_calls for c in calls] == [1, 0]
        assert [c.merged for c in calls] == [False, True] and not any(c.mismatch for c in calls)
        context: dict[str, Any] = json.loads(fleet.redis.get(keys.gateway_context(sid)) or b"{}")
        done = CliRun(calls, context["messages"], context["reply"], context["tools"])
        assert self.harness.tool in {t["function"]["name"] for t in done.tools}
        (result,) = [m for m in done.messages if m["role"] == "tool"]
        assert "a.txt" in result["content"] and "b.txt" in result["content"]  # it ran the call it was given

        (segment,) = segments_from_calls(calls)
        held = [*segment.prompt_ids, *segment.response_ids]
        rendered = fleet.chat.encode(fleet.chat.render([*done.messages, done.reply], False, done.tools))
        assert rendered[: len(held)] == held and rendered[len(held) :] == fleet.chat.encode("\n")
        generated = [t for c in calls for t in c.output_ids]
        assert [t for t, m in zip(segment.response_ids, segment.loss_mask, strict=True) if m] == generated
        assert sum(segment.loss_mask) == len(generated)
        return done

    @property
    def first_reply(self) -> str:
        """The scripted first reply's text before its tool call."""
        return self.harness.prefix + "I will look."


@contextmanager
def cli(name: str, redis_url: str, tmp: Path) -> Iterator[Cli]:
    """Harness ``name`` installed (or the test skipped) and a scripted engine + proxy for it."""
    harness = HARNESSES[name]
    try:
        exe = harness.install()
    except HarnessUnavailable as e:
        pytest.skip(str(e))
    with gateway_fleet(redis_url, tmp, dict(harness.rules(TASK, "ls", ANSWER))) as fleet:
        yield Cli(harness, exe, fleet)

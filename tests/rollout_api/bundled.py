"""Real harnesses from agent bundles, unmodified, inside the task sandbox through the forwarded
gateway: the fleet, the bundles and the token-exact check the in-sandbox harness tests share.

The bundles are the ones in the directory ``ROLLOUT_TEST_AGENT_BUNDLES`` names, else the pinned
versions of ``services/benchmarks/bundled_harnesses.py``, built once per machine into
``/var/cache/rollout-agents`` (``rollout agents install``: npm packages in seconds, PyPI ones in
30-200 s; every directory above a bundle must be searchable by the sandbox user, which /root is
not). Where a bundle cannot be built (no registry), the test that needs it skips with the reason."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis

from services.benchmarks.bundled_harnesses import ensure_bundles
from services.protocol import Trajectory, keys
from services.protocol.gateway import GatewayCall, decode_call, segments_from_calls
from services.protocol.trajectory import Segment
from services.runtime.chat import ChatTemplate
from services.sandbox_broker.bundles import installed
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, task, trajectories, wait_finished

BUNDLE_CACHE = Path("/var/cache/rollout-agents")
JOB = "harness"
CONTEXT = 400_000  # Claude Code's system prompt and tools are ~50 KB: more than the engine's default context


def hermes(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in the pool's (Hermes) format, as the scripted engine answers it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def bundles_dir(names: Sequence[str] = ("mini-swe-agent", "claude-code")) -> Path:
    """Where the bundles are: ``ROLLOUT_TEST_AGENT_BUNDLES``, else the cache with the pinned versions
    of ``names`` (built there when missing; a bundle that cannot be built is left out, and the test
    that needs it skips: see :meth:`Harnesses.bundle`)."""
    given = os.environ.get("ROLLOUT_TEST_AGENT_BUNDLES", "")
    if given:
        return Path(given)
    FAILED.update(ensure_bundles(BUNDLE_CACHE, list(names)))
    return BUNDLE_CACHE


FAILED: dict[str, str] = {}  # bundle -> why it could not be built


@dataclass
class Harnesses:
    """A fleet (Redis, scripted engine, proxy with the gateway, broker on local with the bundles
    bound at /opt/agents, API, one worker) and one job to run harnesses in."""

    fleet: Fleet
    bundles: Path
    headers: dict[str, str] = field(default_factory=dict)

    def bundle(self, name: str) -> str:
        """The bundle's digest; the test skips, saying why, where there is none."""
        if name in FAILED:
            pytest.skip(FAILED[name])
        found = {b.name: b.digest for b in installed(self.bundles)}
        if name not in found:
            pytest.skip(f"no {name} bundle in {self.bundles}")
        return found[name]

    def run(self, task_id: str, agent: dict[str, Any], **extra: Any) -> Trajectory:
        """One task (its prompt names ``task_id``; reward: answer.txt holds 42) with ``agent``."""
        with self.fleet.client() as client:
            if not self.headers:
                self.headers.update(create_job(client, JOB))
            body = {"job": JOB, "group_size": 1, "agent": agent, "max_attempts": 1,
                    "limits": {"max_trajectory_tokens": CONTEXT, "wall_clock_s": 300},
                    "tasks": [task(task_id, f"{task_id}: write 42 into answer.txt", **extra)]}  # fmt: skip
            rollout = submit(client, self.headers, body)
            wait_finished(client, self.headers, rollout, timeout_s=400)
        (traj,) = [t for t in trajectories(self.fleet.redis_url, JOB) if t.rollout_id == rollout]  # not a rerun's
        return traj

    def calls(self, sid: str) -> list[GatewayCall]:
        with redis.Redis.from_url(self.fleet.redis_url) as store:
            raw = store.lrange(keys.gateway_calls(sid), 0, -1)
        return [decode_call(item) for item in cast(list[bytes], raw)]

    def token_exact(self, traj: Trajectory, segments: int = 1) -> dict[str, Any]:
        """Assert the trajectory is ``segments`` token-exact segments, each the calls the gateway
        recorded for it, its loss mask on exactly the tokens the engine generated in them; the ids of
        the one that holds the call recorded last are the chat template rendered over the
        conversation the harness sent last (plus its reply). The conversation (``messages``, ``reply``, ``tools``)."""
        assert traj.agent is not None and traj.agent.retokenization_mismatches == 0
        held = [Segment(prompt_ids=traj.prompt_ids, response_ids=traj.response_ids, loss_mask=traj.loss_mask),
                *traj.segments]  # fmt: skip
        calls = {c.index: c for c in self.calls(traj.agent.session)}
        recorded = segments_from_calls(list(calls.values()))
        assert len(held) == len(recorded) == segments, [s.calls for s in recorded]
        for mine, theirs in zip(held, recorded, strict=True):
            assert (mine.prompt_ids, mine.response_ids, mine.loss_mask) == (
                theirs.prompt_ids, theirs.response_ids, theirs.loss_mask)  # fmt: skip
            generated = [t for t, m in zip(mine.response_ids, mine.loss_mask, strict=True) if m]
            assert generated == [t for i in theirs.calls for t in calls[i].output_ids]
        assert sum(sum(s.loss_mask) for s in held) == sum(t.response_tokens for t in traj.turns)
        with redis.Redis.from_url(self.fleet.redis_url) as store:
            context: dict[str, Any] = orjson.loads(store.get(keys.gateway_context(traj.agent.session)) or b"{}")
        chat = ChatTemplate.from_dir(self.fleet.model_path)
        rendered = chat.encode(chat.render([*context["messages"], context["reply"]], False, context["tools"]))
        (latest,) = [s for s in recorded if max(calls) in s.calls]  # the call recorded last's segment
        last = [*latest.prompt_ids, *latest.response_ids]
        assert rendered[: len(last)] == last and rendered[len(last) :] == chat.encode("\n")
        return context


@contextmanager
def harnesses(root: Path, rules: dict[str, list[Any]], names: list[str]) -> Iterator[Harnesses]:
    """The fleet answering ``rules``, with the bundles of ``names`` (built when missing)."""
    bundles = bundles_dir(names)
    patch = pytest.MonkeyPatch()
    patch.setenv("ROLLOUT_ENGINE_CONTEXT_LENGTH", str(CONTEXT))
    env = {"ROLLOUT_BROKER_AGENTS_DIR": str(bundles)}
    try:
        with running_fleet(root, rules, "hn", broker_env=env, context_cap=CONTEXT) as fleet:
            fleet.start_worker(jobs=[JOB], concurrency=2)
            yield Harnesses(fleet, bundles)
    finally:
        patch.undo()

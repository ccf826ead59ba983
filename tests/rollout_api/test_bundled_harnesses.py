"""Real harnesses from agent bundles, unmodified, inside the task sandbox through the forwarded
gateway: mini-swe-agent (PyPI, its default tool-calling ``mini.yaml``, the local environment: its
bash runs in the sandbox) and Claude Code (npm). The bundles are the ones in the directory
``ROLLOUT_TEST_AGENT_BUNDLES`` names, else the pinned versions below, built once per machine into
``/var/cache/rollout-agents`` (``rollout agents install``: about 40 s from the registries; every
directory above a bundle must be searchable by the sandbox user, which /root is not). Where a
bundle cannot be built (no registry), the test skips with the reason."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from services.protocol import Status, Trajectory, keys
from services.runtime.chat import ChatTemplate
from services.sandbox_broker.bundles import install, installed
from tests.rollout_api.fleet import Fleet, create_job, running_fleet, submit, task, trajectories, wait_finished

BUNDLE_CACHE = Path("/var/cache/rollout-agents")
PINNED = {"mini-swe-agent": "2.4.6", "claude-code": "2.1.328"}
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def bundles_dir() -> Path:
    """Where the bundles are: ``ROLLOUT_TEST_AGENT_BUNDLES``, else the cache with the pinned versions."""
    given = os.environ.get("ROLLOUT_TEST_AGENT_BUNDLES", "")
    if given:
        return Path(given)
    have = {(b.name, b.version) for b in installed(BUNDLE_CACHE)} if BUNDLE_CACHE.is_dir() else set()
    for name, version in PINNED.items():
        if (name, version) not in have:
            try:
                install(name, BUNDLE_CACHE, version)
            except Exception as exc:  # a registry out of reach, a failed build: nothing to test with
                pytest.skip(f"building the {name} {version} bundle failed: {exc}")
    return BUNDLE_CACHE


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


RULES: dict[str, list[Any]] = {
    "MSWEA-INSIDE": [
        "I will write the answer.\n" + hermes("bash", {"command": "echo 42 > answer.txt"}),
        hermes("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
    "CLAUDE-INSIDE": ["Done."],
}
MINI = ('exec mini -y --exit-immediately -l 0 -m "openai/$OPENAI_MODEL" -c mini.yaml '
        '-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -c model.cost_tracking=ignore_errors '
        '-o /tmp/mini.traj.json -t "$ROLLOUT_TASK"')  # fmt: skip
CLAUDE = 'exec claude -p "$ROLLOUT_TASK" --dangerously-skip-permissions --model "$ANTHROPIC_MODEL"'
QUIET = {
    "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    env = {"ROLLOUT_BROKER_AGENTS_DIR": str(bundles_dir())}
    # Claude Code's system prompt and tools are ~50 KB: more than the scripted engine's default context
    patch = pytest.MonkeyPatch()
    patch.setenv("ROLLOUT_ENGINE_CONTEXT_LENGTH", "400000")
    try:
        with running_fleet(tmp_path_factory.mktemp("harness"), RULES, "hn", broker_env=env,
                           context_cap=400_000) as fleet:  # fmt: skip
            fleet.start_worker(jobs=["harness"], concurrency=2)
            yield fleet
    finally:
        patch.undo()


def run_one(fleet: Fleet, task_id: str, agent: dict[str, Any], **extra: Any) -> Trajectory:
    with fleet.client() as client:
        headers = _job(client)
        body = {"job": "harness", "group_size": 1, "agent": agent, "max_attempts": 1,
                "limits": {"max_trajectory_tokens": 400_000, "wall_clock_s": 300},
                "tasks": [task(task_id, f"{task_id}: write 42 into answer.txt", **extra)]}  # fmt: skip
        rollout = submit(client, headers, body)
        wait_finished(client, headers, rollout, timeout_s=400)
    (traj,) = [t for t in trajectories(fleet.redis_url, "harness") if t.task_id == task_id]
    return traj


_HEADERS: dict[str, str] = {}


def _job(client: Any) -> dict[str, str]:
    if not _HEADERS:
        _HEADERS.update(create_job(client, "harness"))
    return _HEADERS


def bundle(name: str) -> str:
    found = {b.name: b.digest for b in installed(bundles_dir())}
    if name not in found:
        pytest.skip(f"no {name} bundle in {bundles_dir()}")
    return found[name]


def test_mini_swe_agent_from_its_bundle_finishes_a_task_token_exact(fleet: Fleet) -> None:
    digest = bundle("mini-swe-agent")
    agent = {"kind": "command", "bundle": "mini-swe-agent", "argv": ["/bin/sh", "-c", MINI], "env": QUIET}
    traj = run_one(fleet, "MSWEA-INSIDE", agent)
    assert traj.status is Status.COMPLETED and traj.reward == 1.0, (traj.infra, traj.agent)
    assert traj.agent is not None and traj.agent.exit_code == 0, traj.agent
    assert (traj.agent.bundle, traj.agent.bundle_digest) == ("mini-swe-agent", digest)
    assert traj.agent.calls == 2 and traj.agent.retokenization_mismatches == 0 and traj.segments == []
    with redis.Redis.from_url(fleet.redis_url) as store:
        context = orjson.loads(store.get(keys.gateway_context(traj.agent.session)))
    chat = ChatTemplate.from_dir(fleet.model_path)
    rendered = chat.encode(chat.render([*context["messages"], context["reply"]], False, context["tools"]))
    held = [*traj.prompt_ids, *traj.response_ids]
    assert rendered[: len(held)] == held and rendered[len(held) :] == chat.encode("\n")
    generated = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert len(generated) == sum(t.response_tokens for t in traj.turns)
    assert chat.decode(generated).count("<tool_call>") == 2


def test_claude_code_from_its_bundle_makes_a_recorded_call(fleet: Fleet) -> None:
    digest = bundle("claude-code")
    agent = {"kind": "command", "bundle": "claude-code", "argv": ["/bin/sh", "-c", CLAUDE], "env": QUIET}
    traj = run_one(fleet, "CLAUDE-INSIDE", agent, answer_check=False)
    assert traj.agent is not None and traj.agent.exit_code == 0, (traj.infra, traj.agent)
    assert (traj.agent.bundle, traj.agent.bundle_digest) == ("claude-code", digest)
    assert traj.agent.calls >= 1 and traj.agent.last_output.strip().endswith("Done."), traj.agent

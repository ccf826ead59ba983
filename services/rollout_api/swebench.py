"""The SWE-bench / SWE-smith instance adapter: an instance becomes a platform ``Task``."""

from __future__ import annotations

import re
import shlex

from services.protocol import RewardSpec, RolloutRequest, SandboxSpec, Task
from services.protocol.swebench import SweBenchRolloutRequest, SweInstance

TEST_PATCH_PATH = "/tmp/rollout_test.patch"
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)

PROMPT = """Please solve this issue in the repository at {repo_dir} ({repo}).

<issue>
{problem}
</issue>

Make the smallest change to the source code (not the tests) that resolves the issue."""


def template_for(image: str | None, default: str = "default") -> str:
    """A broker template name for a container image ("swebench/sweb.eval.x86_64.x:latest" -> a Name)."""
    if not image:
        return default
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", image.rsplit("/", 1)[-1]).strip("-._")  # a Name starts alphanumeric
    return name[:128] or default


def patched_files(patch: str) -> list[str]:
    return sorted({b for _, b in _DIFF_HEADER.findall(patch)})


def reward_command(instance: SweInstance, request: SweBenchRolloutRequest) -> str:
    tests = " ".join(shlex.quote(t) for t in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS])
    steps = [f"cd {shlex.quote(request.repo_dir)}"]
    if instance.test_patch:
        files = " ".join(shlex.quote(f) for f in patched_files(instance.test_patch))
        if files:  # fresh copies of the test files: the agent's edits to them do not count
            steps.append(f"(git checkout -q {shlex.quote(instance.base_commit)} -- {files} 2>/dev/null || true)")
        steps.append(f"git apply {TEST_PATCH_PATH}")
    steps.append(f"{request.test_command} {tests}")
    return " && ".join(steps)


def instance_task(instance: SweInstance, request: SweBenchRolloutRequest) -> Task:
    setup = request.setup
    if setup is None:
        setup = [f"git -C {shlex.quote(request.repo_dir)} checkout -q {shlex.quote(instance.base_commit)}"]
    files = {TEST_PATCH_PATH: instance.test_patch} if instance.test_patch else {}
    return Task(
        id=instance.instance_id,
        prompt=PROMPT.format(repo_dir=request.repo_dir, repo=instance.repo, problem=instance.problem_statement),
        sandbox=SandboxSpec(
            template=request.template or template_for(instance.image_name),
            setup=setup,
            workdir=request.repo_dir,
        ),
        reward=RewardSpec(command=reward_command(instance, request), timeout_s=request.reward_timeout_s, files=files),
        metadata={
            "source": "swebench",
            "instance_id": instance.instance_id,
            "repo": instance.repo,
            "base_commit": instance.base_commit,
            "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
            "PASS_TO_PASS": list(instance.PASS_TO_PASS),
        },
    )


def to_rollout_request(request: SweBenchRolloutRequest) -> RolloutRequest:
    return RolloutRequest(
        job=request.job,
        tasks=[instance_task(i, request) for i in request.instances],
        group_size=request.group_size,
        limits=request.limits,
        sampling=request.sampling,
        priority=request.priority,
        idempotency_key=request.idempotency_key,
        max_attempts=request.max_attempts,
    )

"""The SWE-bench / SWE-smith instance adapter: an instance becomes a platform ``Task``.

Scoring follows the official harness: the test files are put back as they were before the agent
ran (read through the broker's file API, which the agent cannot touch) and the instance's
``test_patch`` is applied to those clean copies; the tests run from ``repo_dir`` with the
instance's environment; per-test outcomes are parsed from the log, and the reward is 1 only if
every FAIL_TO_PASS and PASS_TO_PASS test passes.
"""

from __future__ import annotations

import re
import shlex

from services.protocol import RewardSpec, RolloutRequest, SandboxSpec, ScoredTests, Task
from services.protocol.swebench import SweBenchRolloutRequest, SweInstance

TEST_PATCH_PATH = "/tmp/rollout_test.patch"
APPLY_TEST_PATCH = f"git apply -v {TEST_PATCH_PATH} || patch --batch --fuzz=5 -p1 -i {TEST_PATCH_PATH}"
SETUP_PATCH_PATH = "/tmp/rollout_setup.patch"
APPLY_SETUP_PATCH = (
    f"(git apply {SETUP_PATCH_PATH} || patch --batch -p1 -i {SETUP_PATCH_PATH}) && rm -f {SETUP_PATCH_PATH} && "
    "if git rev-parse --git-dir >/dev/null 2>&1; then git add -A && "
    "git -c user.name=rollout -c user.email=rollout@localhost commit -qm instance; fi"
)
NON_TEST_SUFFIXES = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_UNITTEST_ID = re.compile(r"^\w+ \(([\w.]+)\)$")  # "test_x (module.Class)"

# the repository keeps only the base commit (a new root commit of its tree): no later objects, no
# other branch or tag, no remote, no reflog, no stash; a no-op where the workdir is not a git repository
HIDE_HISTORY = """if git rev-parse --verify -q HEAD >/dev/null 2>&1; then
set -e
base=$(git -c user.name=rollout -c user.email=rollout@localhost commit-tree 'HEAD^{tree}' -m base)
for remote in $(git remote); do git remote remove "$remote"; done
git for-each-ref --format='delete %(refname)' | git update-ref --stdin
git update-ref refs/heads/main "$base" && git symbolic-ref HEAD refs/heads/main && git reset -q
rm -rf .git/logs .git/packed-refs .git/shallow .git/ORIG_HEAD .git/FETCH_HEAD .git/refs/original
git reflog expire --expire=now --all && git -c gc.packRefs=false gc -q --prune=now
fi"""

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


def image_for(instance: SweInstance, pattern: str) -> str:
    """The row's ``image_name``, else SWE-bench's name for the instance's evaluation image."""
    if instance.image_name:
        return instance.image_name
    name = pattern.format(instance_id=instance.instance_id.lower())
    return name.replace("__", "_1776_") if "/" in name else name


def patched_files(patch: str) -> list[str]:
    return sorted({b for _, b in _DIFF_HEADER.findall(patch)})


def scored_files(instance: SweInstance) -> list[str]:
    """The files whose content decides the reward: the test_patch's, and those the test ids name
    (pytest ``path::name``; unittest/Django ``name (module.Class)`` or ``module.Class.name``, whose
    module may live under ``tests/``, as Django's do)."""
    found = set(patched_files(instance.test_patch or ""))
    for test_id in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]:
        if "::" in test_id:
            found.add(test_id.split("::", 1)[0])
        elif module := _unittest_module(test_id):
            path = module.replace(".", "/") + ".py"
            found |= {path, f"tests/{path}"}
    return sorted(found)


def _unittest_module(test_id: str) -> str | None:
    if m := _UNITTEST_ID.match(test_id):
        dotted = m.group(1).split(".")
        return ".".join(dotted[:-2] if dotted[-1] == m.group(0).split(" ")[0] else dotted[:-1]) or None
    parts = test_id.split(".")
    return ".".join(parts[:-2]) if len(parts) >= 3 and " " not in test_id else None


def reward_command(instance: SweInstance, request: SweBenchRolloutRequest) -> str:
    ids = [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]
    files = patched_files(instance.test_patch or "") or sorted({t.split("::", 1)[0] for t in ids if "::" in t})
    files = [f for f in files if not f.endswith(NON_TEST_SUFFIXES)]
    modules = [f.removesuffix(".py").removeprefix("tests/").replace("/", ".") for f in files]
    command = instance.test_command or request.test_command
    if not instance.test_command and not any(p in command for p in ("{files}", "{ids}", "{modules}")):
        command += " {ids}"
    return command.format(files=_join(files), ids=_join(ids), modules=_join(modules))


def _join(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def instance_task(instance: SweInstance, request: SweBenchRolloutRequest) -> Task:
    image = image_for(instance, request.image_pattern)
    return Task(
        id=instance.instance_id,
        prompt=PROMPT.format(repo_dir=request.repo_dir, repo=instance.repo, problem=instance.problem_statement),
        sandbox=SandboxSpec(
            template=request.template or template_for(image),
            setup=[
                *request.setup,
                *([APPLY_SETUP_PATCH] if instance.setup_patch else []),
                *([HIDE_HISTORY] if request.hide_history else []),
            ],
            files={SETUP_PATCH_PATH: instance.setup_patch} if instance.setup_patch else {},
            workdir=request.repo_dir,
            env={**request.env, **instance.env},
        ),
        reward=RewardSpec(
            command=reward_command(instance, request),
            timeout_s=request.reward_timeout_s,
            files={TEST_PATCH_PATH: instance.test_patch} if instance.test_patch else {},
            restore=scored_files(instance),
            setup=[APPLY_TEST_PATCH] if instance.test_patch else [],
            grade_in=request.grade_in,
            tests=ScoredTests(
                fail_to_pass=list(instance.FAIL_TO_PASS),
                pass_to_pass=list(instance.PASS_TO_PASS),
                log_parser=request.log_parser,
                swebench_parser=instance.log_parser if request.log_parser == "swebench" else None,
            ),
        ),
        source=instance.source,
        source_version=instance.source_version,
        metadata={
            "source": instance.source,
            "instance_id": instance.instance_id,
            "repo": instance.repo,
            "base_commit": instance.base_commit,
            "image": image,
            "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
            "PASS_TO_PASS": list(instance.PASS_TO_PASS),
        },
    )


def to_rollout_request(request: SweBenchRolloutRequest) -> RolloutRequest:
    return RolloutRequest(**request.options(), tasks=[instance_task(i, request) for i in request.instances])

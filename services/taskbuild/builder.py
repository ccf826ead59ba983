"""``rollout tasks build``: SWE-style tasks from PyPI sdists, for machines without a registry.

Per task: the library's sdist (with its own tests) is unpacked, the recipe's bug injected, the
tests run on the original and on the buggy tree (FAIL_TO_PASS: passed, then failed; PASS_TO_PASS:
passed on both), the gold patch is the diff back, and the buggy tree (a git repository at
``/testbed``) becomes the top layer of an OCI image over a Debian base (``mmdebstrap``: python3,
git, patch) and a layer with the test dependencies installed from PyPI. Layers are shared between
images (hard-linked blobs). ``tasks.json`` holds one SWE-bench-style instance record per task.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from services.rollout_api.worker.outcomes import FAILED, PASSED, parse_pytest
from services.sandbox_broker.images.archive import layer_from_dir, write_oci_layout
from services.sandbox_broker.images.sources import DEFAULT_PATH, ImageConfig
from services.taskbuild.base import ensure_base
from services.taskbuild.recipe import RECIPES, TaskRecipe

log = logging.getLogger(__name__)

SITE = "usr/local/lib/python3.11/dist-packages"  # Debian 12's python3 reads it
TEST_COMMAND = "python3 -m pytest -rA -p no:cacheprovider {files}"  # what the tasks are scored with
MAX_PASS_TO_PASS = 25
GIT_ENV = {"GIT_AUTHOR_NAME": "rollout", "GIT_AUTHOR_EMAIL": "rollout@localhost", "GIT_COMMITTER_NAME": "rollout",
           "GIT_COMMITTER_EMAIL": "rollout@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}  # fmt: skip


def build(out: Path, cache: Path, *, base: Path | None = None, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Build the recipe's tasks (or those named in ``only``) into ``out``; return their instances."""
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    base_layer = base or ensure_base(cache)
    recipes = [r for r in RECIPES if not only or r.task_id in only]
    instances = []
    with tempfile.TemporaryDirectory(prefix="rollout-tasks-") as scratch:
        work = Path(scratch)
        for recipe in recipes:
            deps = _deps_layer(cache, recipe.test_deps)
            instances.append(_build_one(recipe, out, cache, work / recipe.task_id, [base_layer, deps]))
            log.info("built task %s", recipe.task_id)
    (out / "tasks.json").write_text(json.dumps(instances, indent=1))
    return instances


def _build_one(recipe: TaskRecipe, out: Path, cache: Path, work: Path, lower: list[Path]) -> dict[str, Any]:
    repo = work / "layer" / "testbed"
    _unpack_sdist(_sdist(cache, recipe.package), repo)
    target = repo / recipe.file
    original = target.read_text()
    if original.count(recipe.old) != 1:
        raise ValueError(f"{recipe.task_id}: the bug's text is not found exactly once in {recipe.file}")
    gold = _run_tests(repo, recipe)
    buggy = original.replace(recipe.old, recipe.new)
    target.write_text(buggy)
    bug = _run_tests(repo, recipe)
    fail_to_pass = sorted(t for t, s in gold.items() if s == PASSED and bug.get(t) in (FAILED, "ERROR"))
    pass_to_pass = sorted(t for t, s in gold.items() if s == PASSED and bug.get(t) == PASSED)[:MAX_PASS_TO_PASS]
    if not fail_to_pass:
        raise ValueError(f"{recipe.task_id}: the injected bug makes no test fail")
    commit = git_commit(repo)
    image = out / "images" / recipe.task_id
    shutil.rmtree(image, ignore_errors=True)
    env = [f"PATH={DEFAULT_PATH}"] + ([f"PYTHONPATH=/testbed/{recipe.pythonpath}"] if recipe.pythonpath else [])
    top = layer_from_dir(work / "layer", work / "repo.tar")
    config = ImageConfig(env=tuple(env), workdir="/testbed", user="")
    digest = write_oci_layout(image, [*lower, top], config, out / "blobs")
    return {
        "instance_id": recipe.task_id, "repo": recipe.package.split("==")[0], "base_commit": commit,
        "problem_statement": recipe.problem, "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass,
        "patch": _diff(recipe.file, buggy, original), "test_patch": None,
        "image_name": f"rollout-tasks/{recipe.task_id}", "image_path": str(image.resolve()),
        "image_digest": digest, "test_file": recipe.test_file, "test_command": TEST_COMMAND,
    }  # fmt: skip


def _sdist(cache: Path, requirement: str) -> Path:
    """The sdist of ``requirement`` from PyPI (pip's own client), downloaded once into ``cache``."""
    name, _, version = requirement.partition("==")
    stem = f"{name.replace('_', '-')}-{version}"
    found = [p for p in (cache / "sdists").glob("*.tar.gz") if p.name.lower().replace("_", "-").startswith(stem)]
    if found:
        return found[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(cache / "sdists"), requirement], check=True)  # fmt: skip
    return _sdist(cache, requirement)


def _unpack_sdist(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(dest.parent / ".sdist", filter="data")
    (dest.parent / ".sdist" / top).rename(dest)
    (dest.parent / ".sdist").rmdir()


def _run_tests(repo: Path, recipe: TaskRecipe) -> dict[str, str]:
    # as in the image: none of the caller's pytest options or plugins (a PYTEST_ADDOPTS naming a plugin
    # that the task's PYTHONPATH cannot import made every run fail, and every recipe "make no test fail")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env["PYTHONPATH"] = str(repo / recipe.pythonpath) if recipe.pythonpath else str(repo)
    argv = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", recipe.test_file]
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False)
    statuses = parse_pytest(done.stdout)
    tests = {t: s for t, s in statuses.items() if "::" in t and " " not in t}
    if not tests:
        raise ValueError(f"{recipe.task_id}: pytest reported no test (exit {done.returncode}): "
                         f"{(done.stdout + done.stderr)[-1500:]}")  # fmt: skip
    return tests


def git_commit(repo: Path) -> str:
    env = {**os.environ, **GIT_ENV}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *argv], env=env, check=True, capture_output=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return head.stdout.strip()


def _diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def _deps_layer(cache: Path, extra: tuple[str, ...]) -> Path:
    """pytest (the host's version, so outcomes match the build's) plus ``extra``, from PyPI."""
    wanted = sorted({f"pytest=={metadata.version('pytest')}", *extra})
    layer = cache / f"deps-{hashlib.sha256(' '.join(wanted).encode()).hexdigest()[:16]}.tar"
    if layer.exists():
        return layer
    with tempfile.TemporaryDirectory(prefix="rollout-deps-") as scratch:
        root = Path(scratch) / "root"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target",
                        str(root / SITE), *wanted], check=True)  # fmt: skip
        shutil.rmtree(root / SITE / "bin", ignore_errors=True)
        layer_from_dir(root, layer.with_suffix(".tmp"))
        layer.with_suffix(".tmp").rename(layer)
    return layer

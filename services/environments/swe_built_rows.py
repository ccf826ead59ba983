"""The tasks ``rollout tasks build`` makes from PyPI libraries (SWE-bench-style records) written as
rows of each SWE instance format, with the images that format's harness expects, so that an
instance file of every format runs over real libraries' own tests:

- **SWE-bench** rows: the record's fields, ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as JSON strings as
  the published datasets hold them; the task's own image (the buggy tree at ``/testbed``).
- **SWE-Gym** rows: the same fields as lists, ``image_name`` the task's image.
- **SWE-smith** rows: one image per library snapshot, holding the *fixed* tree as a clean git
  repository (the task image's lower layers and a new top layer: the original sdist tree, one
  commit); the row's ``patch`` is the bug (``git diff`` from that commit to the buggy tree), its
  ``repo`` ``swesmith/<owner>__<name>.<commit8>`` and its id ``<owner>__<name>.<commit8>.<task>``.
  Tasks of one library share the image, as SWE-smith's do.
- **R2E-Gym** rows: the task's image with one more layer: the task's test file (and its folder's
  package files) under ``/r2e_tests``, ``/testbed/run_tests.sh`` running them with pytest, and both
  named in the repository's ``.git/info/exclude`` (they are the harness's, not the agent's diff).
  ``expected_output_json`` holds every FAIL_TO_PASS and PASS_TO_PASS test, renamed to the
  ``r2e_tests/`` path they run from, as ``PASSED``; R2E-Gym's rows do not say which of them failed
  before the fix, so the importer scores them all as FAIL_TO_PASS (services/environments/r2egym.py).

:func:`expected_tests` gives, per format, the FAIL_TO_PASS / PASS_TO_PASS the importer must map a
row to; ``rollout bench swe --formats`` and tests/environments/test_swe_built_rows_e2e.py check it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.rollout_api.swebench import patched_files
from services.sandbox_broker.images.archive import layer_from_dir, write_oci_layout
from services.sandbox_broker.images.sources import open_source
from services.taskbuild.builder import GIT_ENV, git_commit

FORMATS = ("swebench", "swe-gym", "swe-smith", "r2e-gym")
OWNER = "rollout-tasks"  # the SWE-smith / R2E-Gym image names' owner part
R2E_DIR = "r2e_tests"
CREATED = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class Snapshot:
    """A library's fixed tree (the SWE-smith image), and the bug of one task as a patch from it."""

    image_name: str
    image_path: Path
    commit: str
    bug_patch: str


def image_layers(image: Path) -> tuple[list[Path], Any]:
    """The plain-tar layer files of an OCI layout (base first; the builder writes them uncompressed)
    and its config."""
    source = open_source(image)
    if source.kind != "oci":
        raise ValueError(f"{image}: an OCI image layout is expected (`rollout tasks build` writes one)")
    return [image / name for name in source.layers], source.config


def _testbed(top_layer: Path, dest: Path) -> Path:
    with tarfile.open(top_layer) as tar:
        tar.extractall(dest, filter="tar")
    if not (dest / "testbed" / ".git").is_dir():
        raise ValueError(f"{top_layer}: the top layer holds no git repository at /testbed")
    return dest / "testbed"


def _git(repo: Path, *argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(["git", "-C", str(repo), *argv], input=stdin, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(argv)} in {repo}: {done.stderr.strip()}")
    return done.stdout


def snapshot(instance: dict[str, Any], out: Path, blobs: Path) -> Snapshot:
    """The SWE-smith image of ``instance``'s library (made once per fixed tree) and its bug patch."""
    lower, config = image_layers(Path(instance["image_path"]))
    with tempfile.TemporaryDirectory(prefix="rollout-swe-smith-") as scratch:
        work = Path(scratch)
        repo = _testbed(lower[-1], work / "top")
        _git(repo, "apply", "-", stdin=instance["patch"])  # the gold patch: the tree as published
        shutil.rmtree(repo / ".git")
        commit = git_commit(repo)
        _git(repo, "apply", "-R", "-", stdin=instance["patch"])
        bug = _git(repo, "diff")
        _git(repo, "checkout", "--", ".")
        name = f"{OWNER}__{instance['repo']}.{commit[:8]}"
        image = out / "swe-smith" / name
        if not (image / "index.json").exists():
            (work / "layer").mkdir()
            repo.rename(work / "layer" / "testbed")
            top = layer_from_dir(work / "layer", work / "fixed.tar")
            write_oci_layout(image, [*lower[:-1], top], config, blobs)
    return Snapshot(f"swebench/swesmith.x86_64.{name.replace('__', '_1776_')}".lower(), image, commit, bug)


def r2e_image(instance: dict[str, Any], out: Path, blobs: Path) -> tuple[str, Path]:
    """R2E-Gym's layout over the task's image: ``/r2e_tests``, ``/testbed/run_tests.sh``."""
    lower, config = image_layers(Path(instance["image_path"]))
    tag = instance["base_commit"]
    image = out / "r2e-gym" / f"{instance['repo']}_final-{tag[:12]}"
    if not (image / "index.json").exists():
        with tempfile.TemporaryDirectory(prefix="rollout-r2e-") as scratch:
            work = Path(scratch)
            repo = _testbed(lower[-1], work / "top")
            test_file = repo / instance["test_file"]
            layer = work / "layer"
            (layer / R2E_DIR).mkdir(parents=True)
            siblings = [test_file]
            if test_file.parent != repo:  # a test package: what its relative imports and fixtures need
                siblings += [*test_file.parent.glob("__init__.py"), *test_file.parent.glob("conftest.py")]
            for path in siblings:
                shutil.copy(path, layer / R2E_DIR / path.name)
            (layer / "testbed" / ".git" / "info").mkdir(parents=True)
            run_tests = (
                f"#!/bin/bash\npython3 -m pytest -rA -p no:cacheprovider --rootdir=. {R2E_DIR}/{test_file.name}\n"
            )
            (layer / "testbed" / "run_tests.sh").write_text(run_tests)
            (layer / "testbed" / "run_tests.sh").chmod(0o755)
            exclude = repo / ".git" / "info" / "exclude"
            kept = exclude.read_text() if exclude.exists() else ""
            (layer / "testbed" / ".git" / "info" / "exclude").write_text(f"{kept}{R2E_DIR}\nrun_tests.sh\n")
            write_oci_layout(image, [*lower, layer_from_dir(layer, work / "r2e.tar")], config, blobs)
    return f"namanjain12/{instance['repo']}_final:{tag}", image


def r2e_test_id(instance: dict[str, Any], test_id: str) -> str:
    """``tests/test_lru.py::T::test_x`` -> ``r2e_tests/test_lru.py::T::test_x``."""
    path, _, rest = test_id.partition("::")
    return f"{R2E_DIR}/{Path(path).name}::{rest}"


def expected_tests(instance: dict[str, Any], fmt: str) -> tuple[list[str], list[str]]:
    """The FAIL_TO_PASS and PASS_TO_PASS a row of ``fmt`` made from ``instance`` must import as."""
    if fmt == "r2e-gym":
        return sorted(r2e_test_id(instance, t) for t in [*instance["FAIL_TO_PASS"], *instance["PASS_TO_PASS"]]), []
    return list(instance["FAIL_TO_PASS"]), list(instance["PASS_TO_PASS"])


def row(
    instance: dict[str, Any], fmt: str, out: Path, blobs: Path, problem: str | None = None
) -> tuple[dict[str, Any], str, Path]:
    """``instance`` (a ``tasks.json`` record) as a row of ``fmt``, the image the row names and the
    layout holding it (derived images are written under ``out``, their blobs into ``blobs``)."""
    statement = problem or instance["problem_statement"]
    f2p, p2p = list(instance["FAIL_TO_PASS"]), list(instance["PASS_TO_PASS"])
    own = (instance["image_name"], Path(instance["image_path"]))
    common = {"instance_id": instance["instance_id"], "repo": instance["repo"], "base_commit": instance["base_commit"],
              "patch": instance["patch"], "test_patch": "", "problem_statement": statement, "hints_text": "",
              "created_at": CREATED, "version": "1.0", "image_name": own[0]}  # fmt: skip
    if fmt == "swebench":
        return {**common, "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),
                "environment_setup_commit": instance["base_commit"]}, *own  # fmt: skip
    if fmt == "swe-gym":
        return {**common, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}, *own
    if fmt == "swe-smith":
        snap = snapshot(instance, out, blobs)
        repo = f"{OWNER}__{instance['repo']}.{snap.commit[:8]}"
        smith = {"instance_id": f"{repo}.{instance['instance_id']}", "repo": f"swesmith/{repo}",
                "patch": snap.bug_patch, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "created_at": CREATED,
                "image_name": snap.image_name, "problem_statement": statement}  # fmt: skip
        return smith, snap.image_name, snap.image_path
    if fmt == "r2e-gym":
        image, path = r2e_image(instance, out, blobs)
        expected = dict.fromkeys(expected_tests(instance, fmt)[0], "PASSED")
        commits = {"old_commit_hash": instance["base_commit"], "new_commit_hash": instance["base_commit"],
                   "file_diffs": []}  # fmt: skip
        return {"repo_name": instance["repo"], "docker_image": image, "commit_hash": instance["base_commit"],
                "parsed_commit_content": json.dumps(commits), "problem_statement": statement,
                "instance_id": f"{instance['instance_id']}-r2e", "expected_output_json": json.dumps(expected),
                "modified_files": patched_files(instance["patch"])}, image, path  # fmt: skip
    raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")

"""The SWE route's history hiding, run by a real git on a repository with a future: later commits,
a branch, a tag, a remote, a stash and a reflog. Afterwards only the base commit's tree is there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from services.rollout_api.swebench import HIDE_HISTORY

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
ID = "-c user.name=t -c user.email=t@t"


def _sh(command: str, cwd: Path) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_only_the_base_commit_is_left(tmp_path: Path) -> None:
    upstream, repo = tmp_path / "upstream", tmp_path / "repo"
    upstream.mkdir()
    _sh(f"git init -q && echo v1 > a.py && git add -A && git {ID} commit -qm one", upstream)
    _sh(f"git clone -q {upstream} {repo}", tmp_path)
    _sh(f"echo fixed > a.py && git {ID} commit -qam 'the fix' && git tag v2 && git branch future", repo)
    fix = _sh("git rev-parse HEAD:a.py", repo)
    _sh(f"git reset -q --hard HEAD~1 && echo wip > a.py && git {ID} stash -q", repo)  # the base, as the image has it
    _sh(HIDE_HISTORY, repo)
    assert _sh("git rev-list --all --reflog | wc -l", repo) == "1"
    assert _sh("git remote; git tag; git stash list", repo) == ""
    assert _sh("git branch --format='%(refname:short)'", repo) == "main"
    assert _sh("cat a.py; git status --porcelain", repo) == "v1"
    assert subprocess.run(["git", "cat-file", "-e", fix], cwd=repo, capture_output=True).returncode != 0
    assert not (repo / ".git" / "logs").exists() and not (repo / ".git" / "packed-refs").exists()


def test_a_directory_that_is_no_repository_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x")
    _sh(f"export GIT_CEILING_DIRECTORIES={tmp_path.parent}\n{HIDE_HISTORY}", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]

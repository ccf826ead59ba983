"""The agent's change as fresh grading takes it: a real ``git diff`` of a real repository, filtered by
the path rules and applied to a clean copy with ``git apply``, as the grading sandbox does."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from services.rollout_api.worker.grading import DIFF_OPTIONS, GIT, filter_patch, protected

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _sh(command: str, cwd: Path) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _repo(path: Path) -> str:
    (path / "pkg").mkdir(parents=True)
    (path / "tests").mkdir()
    (path / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "tests" / "test_calc.py").write_text("from pkg.calc import add\n\ndef test_add():\n    assert add(2, 3)\n")
    (path / "pyproject.toml").write_text("[project]\nname = 'calc'\n")
    _sh("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base", path)
    return _sh("git rev-parse HEAD", path).strip()


def test_only_the_source_change_is_applied(tmp_path: Path) -> None:
    agent, clean = tmp_path / "agent", tmp_path / "clean"
    base = _repo(agent)
    shutil.copytree(agent, clean)
    (agent / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")  # the fix: taken
    (agent / "pkg" / "new module.py").write_text("X = 1\n")  # a new source file, a space in its name: taken
    (agent / "tests" / "test_calc.py").write_text("def test_add():\n    pass\n")  # the test: never
    (agent / "conftest.py").write_text("import pytest\n")
    (agent / "pkg" / "evil.pth").write_text("import os\n")
    (agent / "sitecustomize.py").write_text("import os\n")
    (agent / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p evil'\n")
    (agent / "pkg" / "test_extra.py").write_text("def test_x():\n    pass\n")
    (agent / "pkg" / "link.py").symlink_to("../tests/test_calc.py")  # a link: never
    (agent / "tests" / "test_calc.py").unlink()
    (agent / "tests" / "test_calc.py").symlink_to("../pkg/calc.py")  # a file become a link: two blocks, both dropped
    _sh("git -c user.name=a -c user.email=a@a commit -qam 'agent commits too'", agent)  # diffed against base
    patch = _sh(f"{GIT} add -A -- . && {GIT} diff {DIFF_OPTIONS} {base} --", agent)
    change = filter_patch(patch, keep=[])
    assert sorted(set(change.dropped)) == sorted([
        "conftest.py", "pkg/evil.pth", "pkg/link.py", "pkg/test_extra.py", "pyproject.toml",
        "sitecustomize.py", "tests/test_calc.py",
    ])  # fmt: skip
    (tmp_path / "agent.patch").write_text(change.patch)
    _sh(f"{GIT} apply --binary --whitespace=nowarn {tmp_path / 'agent.patch'}", clean)
    assert (clean / "pkg" / "calc.py").read_text().endswith("a + b\n")
    assert (clean / "pkg" / "new module.py").read_text() == "X = 1\n"
    assert (clean / "tests" / "test_calc.py").read_text().startswith("from pkg.calc import add")
    assert not (clean / "conftest.py").exists() and not (clean / "pkg" / "link.py").exists()
    assert (clean / "pyproject.toml").read_text() == "[project]\nname = 'calc'\n"


def test_the_path_rules() -> None:
    assert protected("src/pkg/tests/helpers.py", []) and protected("test/data.json", [])
    assert protected("docs/conf/setup.cfg", []) and protected("lib/x_test.py", [])
    assert protected("fixtures/data.txt", ["fixtures"]) and protected("fixtures", ["fixtures/"])
    assert not protected("src/pkg/testing.py", []) and not protected("src/latest/x.py", [])
    assert not protected("fixtures2/data.txt", ["fixtures"])

"""Agent bundles on disk: the manifest, the digest over the tree, read-only and swapped in whole."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.protocol.agents import AgentBundle
from services.sandbox_broker.bundles import RECIPES, digest_of, installed, publish, wrapper


def build(text: str, executable: bool = True) -> Callable[[Path], str]:
    def fill(tree: Path) -> str:
        wrapper(tree / "bin" / "tool", f"/bin/echo {text}")
        (tree / "lib").mkdir()
        (tree / "lib" / "data.txt").write_text(text)
        (tree / "lib" / "link").symlink_to("data.txt")
        if not executable:
            (tree / "bin" / "tool").chmod(0o644)
        return "2.0"

    return fill


def test_a_published_bundle_has_its_manifest_and_is_read_only(tmp_path: Path) -> None:
    bundle = publish(tmp_path, "tool", "local:test", ["tool"], build("a"))
    tree = tmp_path / "tool"
    assert AgentBundle.model_validate_json((tree / "bundle.json").read_text()) == bundle
    assert (bundle.version, bundle.source, bundle.commands) == ("2.0", "local:test", ["tool"])
    assert bundle.digest == digest_of(tree) and bundle.digest.startswith("sha256:")
    assert (tree / "bin" / "tool").read_text() == '#!/bin/sh\nexec /bin/echo a "$@"\n'
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o022 == 0 and path.stat().st_mode & 0o004, path
    assert installed(tmp_path) == [bundle]
    assert sorted(os.listdir(tmp_path)) == [".tool.lock", "tool"]  # no staging tree left (the lock stays)


def test_the_digest_follows_contents_the_executable_bit_and_links(tmp_path: Path) -> None:
    digests = {publish(tmp_path / str(i), "tool", "local:test", ["tool"], fill).digest
               for i, fill in enumerate([build("a"), build("b"), build("a", executable=False)])}  # fmt: skip
    assert len(digests) == 3
    again = publish(tmp_path / "again", "tool", "local:test", ["tool"], build("a"))
    assert again.digest in digests  # the same tree, the same digest, wherever it was built


def test_a_failed_build_leaves_the_installed_bundle_alone(tmp_path: Path) -> None:
    first = publish(tmp_path, "tool", "local:test", ["tool"], build("a"))

    def broken(tree: Path) -> str:
        raise RuntimeError("registry unreachable")

    with pytest.raises(RuntimeError):
        publish(tmp_path, "tool", "local:test", ["tool"], broken)
    assert installed(tmp_path) == [first] and sorted(os.listdir(tmp_path)) == [".tool.lock", "tool"]


def test_recipes_name_the_packages_the_issue_asks_for() -> None:
    sources = {f"{r.source}:{r.package}" for r in RECIPES.values()}
    assert {"pypi:mini-swe-agent", "npm:@anthropic-ai/claude-code", "npm:@openai/codex"} <= sources


def test_two_builds_of_one_bundle_at_once_take_turns_and_a_waiting_one_keeps_the_others(tmp_path: Path) -> None:
    """Two processes installing one bundle at once (two ``rollout agents install``, two test files that
    need it): without a lock the second removed the first's staging tree mid-build. (Threads here: the
    lock is per open file, so two threads contend as two processes do.)"""
    spans: list[tuple[float, float, str]] = []
    guard = threading.Lock()

    def slow(text: str) -> Callable[[Path], str]:
        def fill(tree: Path) -> str:
            start = time.monotonic()
            version = build(text)(tree)
            time.sleep(0.5)
            with guard:
                spans.append((start, time.monotonic(), text))
            return version

        return fill

    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda text: publish(tmp_path, "tool", "local:test", ["tool"], slow(text)), "ab"))
    (_, end, _), (start, _, later) = sorted(spans)
    assert start >= end  # one after the other, and the later one is what is installed
    assert installed(tmp_path) == [made["ab".index(later)]]
    assert sorted(os.listdir(tmp_path)) == [".tool.lock", "tool"]

    spans.clear()  # a build that may keep what is there: the one that waited builds nothing
    with ThreadPoolExecutor(2) as pool:
        kept = list(pool.map(lambda text: publish(tmp_path / "k", "tool", "local:test", ["tool"], slow(text),
                                                  keep=lambda bundle: True), "ab"))  # fmt: skip
    assert len(spans) == 1 and kept[0] == kept[1] == installed(tmp_path / "k")[0]

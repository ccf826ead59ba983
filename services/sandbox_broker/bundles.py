"""Agent bundles: read-only trees of an agent harness, built once per broker host from a package
registry and bound at ``/opt/agents/NAME`` into local sandboxes (``BrokerSettings.agents_dir``).

``DIR/NAME`` holds ``bundle.json`` (:class:`AgentBundle`: source, version, digest), ``bin/`` (one
small ``sh`` wrapper per command, with the paths the sandbox sees) and the runtime:

- PyPI: ``venv/``, a virtual environment of the interpreter the sandboxes run (the host's
  ``/usr/bin/python3``, which a local sandbox sees read-only), the package installed with uv (pip
  where uv is not installed: ``services/runtime/installer.py``);
- npm: ``node/``, a copy of the host's ``node`` binary and the package installed with npm.

A bundle is built beside its final place and swapped in whole, so a sandbox never sees half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.protocol.agents import AGENTS_DIR, BUNDLE_MANIFEST, AgentBundle
from services.runtime.installer import exclusive, install_command

SANDBOX_PYTHON = "/usr/bin/python3"  # local sandboxes see the host's /usr


@dataclass(frozen=True, slots=True)
class Recipe:
    source: Literal["pypi", "npm"]
    package: str
    # command in bin/ -> the package's console script (PyPI; "python": the venv's interpreter) or bin entry (npm)
    commands: dict[str, str]


RECIPES: dict[str, Recipe] = {
    "mini-swe-agent": Recipe("pypi", "mini-swe-agent", {"mini": "mini"}),
    "aider": Recipe("pypi", "aider-chat", {"aider": "aider"}),
    "openai-sdk": Recipe("pypi", "openai", {"python": "python"}),  # an agent program of one's own on the SDK
    "claude-code": Recipe("npm", "@anthropic-ai/claude-code", {"claude": "claude"}),
    "codex": Recipe("npm", "@openai/codex", {"codex": "codex"}),
    "gemini-cli": Recipe("npm", "@google/gemini-cli", {"gemini": "gemini"}),
    "qwen-code": Recipe("npm", "@qwen-code/qwen-code", {"qwen": "qwen"}),
    "opencode": Recipe("npm", "opencode-ai", {"opencode": "opencode"}),
}


def install(name: str, root: Path, version: str | None = None, python: str = SANDBOX_PYTHON, *,
            missing_only: bool = False) -> AgentBundle:  # fmt: skip
    """Build bundle ``name`` from its recipe under ``root`` (replacing the one there); its manifest.
    ``missing_only``: where ``name`` is installed already (at ``version``, if given), that one, unbuilt."""
    recipe = RECIPES[name]
    inside = f"{AGENTS_DIR}/{name}"

    def build(tree: Path) -> str:
        if recipe.source == "pypi":
            return _pypi(recipe, tree, inside, version, python)
        return _npm(recipe, tree, inside, version)

    def current(bundle: AgentBundle) -> bool:
        return version in (None, bundle.version)

    return publish(root, name, f"{recipe.source}:{recipe.package}", sorted(recipe.commands), build,
                   keep=current if missing_only else None)  # fmt: skip


def publish(root: Path, name: str, source: str, commands: list[str], build: Callable[[Path], str], *,
            keep: Callable[[AgentBundle], bool] | None = None) -> AgentBundle:  # fmt: skip
    """``build(tree)`` fills a fresh tree and returns the version; the tree gets its manifest, is made
    read-only to everyone but its owner, and replaces ``root/name``. One build of a name at a time
    (an exclusive lock on ``root/.NAME.lock``: another process building it waits); once the lock is
    held, an installed bundle that ``keep`` accepts is returned as it is (the one a build that ran
    meanwhile made)."""
    root.mkdir(parents=True, exist_ok=True)
    with exclusive(root / name):
        there = _manifest(root / name / BUNDLE_MANIFEST) if keep is not None else None
        if there is not None and keep is not None and keep(there):
            return there
        return _publish(root, name, source, commands, build)


def _publish(root: Path, name: str, source: str, commands: list[str], build: Callable[[Path], str]) -> AgentBundle:
    tree, final, old = root / f".{name}.new", root / name, root / f".{name}.old"
    for leftover in (tree, old):
        shutil.rmtree(leftover, ignore_errors=True)
    tree.mkdir()
    try:
        version = build(tree)
        manifest = AgentBundle(name=name, source=source, version=version, digest=digest_of(tree), commands=commands)
        (tree / BUNDLE_MANIFEST).write_text(manifest.model_dump_json(indent=1) + "\n")
        _read_only(tree)
        if final.exists():
            final.rename(old)
        tree.rename(final)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return manifest


def installed(root: Path) -> list[AgentBundle]:
    return [bundle for path in sorted(root.glob(f"*/{BUNDLE_MANIFEST}")) if (bundle := _manifest(path)) is not None]


def _manifest(path: Path) -> AgentBundle | None:
    """The bundle a manifest describes; None where it is missing or unreadable."""
    try:
        return AgentBundle.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def digest_of(tree: Path) -> str:
    """``sha256:<hex>`` over every path of the tree (its manifest aside): names, the executable bit,
    link targets and contents, in a fixed order."""
    total = hashlib.sha256()
    for path in sorted(tree.rglob("*")):
        relative = path.relative_to(tree).as_posix()
        if relative == BUNDLE_MANIFEST or (path.is_dir() and not path.is_symlink()):
            continue
        if path.is_symlink():
            entry = f"L {relative} {os.readlink(path)}"
        else:
            entry = f"{'x' if os.access(path, os.X_OK) else 'f'} {relative} {_file_digest(path)}"
        total.update(entry.encode() + b"\n")
    return "sha256:" + total.hexdigest()


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def wrapper(path: Path, command: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    path.chmod(0o755)


def _pypi(recipe: Recipe, tree: Path, inside: str, version: str | None, python: str) -> str:
    venv = tree / "venv"
    _run([python, "-m", "venv", str(venv)])
    spec = f"{recipe.package}=={version}" if version else recipe.package
    installer, env = install_command(str(venv / "bin" / "python"))
    _run([*installer, spec], env)
    found = _run([str(venv / "bin" / "python"), "-c",
                  f"import importlib.metadata as m; print(m.version({recipe.package!r}))"]).strip()  # fmt: skip
    for command, script in recipe.commands.items():  # the script itself: its shebang has the build path
        python = f"{inside}/venv/bin/python"
        wrapper(tree / "bin" / command, python if script == "python" else f"{python} {inside}/venv/bin/{script}")
    return found


def _npm(recipe: Recipe, tree: Path, inside: str, version: str | None) -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("npm bundles need node and npm on this host")
    (tree / "node" / "bin").mkdir(parents=True)
    shutil.copy2(os.path.realpath(node), tree / "node" / "bin" / "node")  # the runtime travels with the bundle
    spec = f"{recipe.package}@{version}" if version else recipe.package
    _run([npm, "install", "--prefix", str(tree / "node"), "--no-audit", "--no-fund", "--omit=dev", "--quiet", spec])
    package_dir = tree / "node" / "node_modules" / recipe.package
    package = json.loads((package_dir / "package.json").read_text())
    bins = package.get("bin") or {}
    for command, entry in recipe.commands.items():
        target = bins if isinstance(bins, str) else bins[entry]
        program = package_dir / target
        native = program.read_bytes()[:4] == b"\x7fELF"
        runner = "" if native else f"{inside}/node/bin/node "
        wrapper(tree / "bin" / command, f"{runner}{inside}/node/node_modules/{recipe.package}/{target}")
    return str(package["version"])


def _read_only(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            mode = path.stat().st_mode
            path.chmod((mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0)) & ~0o022)


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout

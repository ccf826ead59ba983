"""Installing into another environment (agent bundles, host harnesses): pip's configuration handed to
uv, and a real install of a wheel made here, offline, with uv and with the pip fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from services.runtime import installer


def test_pips_configuration_becomes_uvs_options_and_the_certificate_a_variable() -> None:
    config = [("constraint", "/etc/c.txt"), ("find-links", "/w1"), ("find-links", "/w2"), ("timeout", "60"),
              ("index-url", "https://i/simple"), ("extra-index-url", "file:///x"), ("cert", "/ca.pem")]  # fmt: skip
    options, env = installer.uv_options("/v/bin/python", config)
    assert options == ["--python", "/v/bin/python", "--index-strategy", "unsafe-best-match",
                       "--constraint", "/etc/c.txt", "--find-links", "/w1", "--find-links", "/w2",
                       "--index-url", "https://i/simple", "--extra-index-url", "file:///x"]  # fmt: skip
    assert env == {"SSL_CERT_FILE": "/ca.pem"}


def test_pips_configuration_is_read_from_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no file: only the variables below
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/a /wheels/b")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/pins.txt")
    assert sorted(installer.pip_config(sys.executable)) == [
        ("config-file", os.devnull), ("constraint", "/etc/pins.txt"), ("find-links", "/wheels/a"),
        ("find-links", "/wheels/b")]  # fmt: skip
    assert installer.pip_config("/nonexistent/python") == []


def wheel(where: Path) -> Path:
    """A pure-Python wheel of one module, ``rollout_probe`` 1.0."""
    path = where / "rollout_probe-1.0-py3-none-any.whl"
    dist = "rollout_probe-1.0.dist-info"
    files = {
        "rollout_probe.py": "ANSWER = 42\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: rollout-probe\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_a_wheel_is_installed_into_another_environment_byte_compiled(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tool == "uv" and installer.uv_binary() is None:
        pytest.skip("uv is not installed here (scripts/setup.sh installs it)")
    if tool == "pip":
        monkeypatch.setattr(installer, "uv_binary", lambda: None)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", *(["--without-pip"] if tool == "uv" else []), str(venv)], check=True)
    python = str(venv / "bin" / "python")
    command, env = installer.install_command(python)
    assert Path(command[0]).name == ("uv" if tool == "uv" else "python")
    argv = [*command, "--no-index", "--find-links", str(wheels), "rollout-probe"]
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, **env}, timeout=120)
    (module,) = venv.glob("lib/python3*/site-packages/rollout_probe.py")
    if tool == "uv":  # compiled at install (a bundle is read-only: a harness would compile at every start)
        assert list((module.parent / "__pycache__").glob("rollout_probe.*.pyc"))
    probe = "import rollout_probe; print(rollout_probe.ANSWER, rollout_probe.__file__)"
    done = subprocess.run([python, "-B", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["42", str(module)]

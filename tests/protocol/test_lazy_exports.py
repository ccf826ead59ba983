"""``services.protocol`` loads its exports on first use: each name is its submodule's object, an
unknown name is an AttributeError, and a process that imports one light submodule (an engine or
a proxy: the field types, the weight updates) does not build the task models."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import services.protocol as protocol
from services.runtime.processes import REPO_ROOT, python_env


def test_every_export_is_its_submodules_object() -> None:
    assert sorted(protocol.__all__) == sorted(protocol._HOME)
    for name, module in protocol._HOME.items():
        assert getattr(protocol, name) is getattr(importlib.import_module(f"services.protocol.{module}"), name)
    assert set(protocol.__all__) <= set(dir(protocol))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        protocol.NoSuchThing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from services.protocol import NoSuchThing", {})


def test_light_submodules_do_not_build_the_task_models() -> None:
    modules = (
        "services.protocol.fields, services.protocol.weights, services.engines.settings, services.llm_proxy.settings"
    )
    probe = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.startswith('services.protocol')))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=python_env(), capture_output=True, text=True, check=True
    )
    loaded = done.stdout
    assert "services.protocol.weights" in loaded and "services.protocol.tasks" not in loaded, loaded
    assert "services.protocol.agents" not in loaded, loaded

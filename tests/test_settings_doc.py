"""docs/settings.md is what ``rollout settings docs`` generates from the settings classes."""

from __future__ import annotations

import pytest

from services.cli.main import main
from services.cli.settings_doc import DOC, iter_variables, render, settings_classes


def test_docs_settings_md_is_not_stale() -> None:
    assert DOC.read_text() == render(), "docs/settings.md is stale: run `rollout settings docs --write`"


def test_every_field_of_every_class_has_a_row() -> None:
    """Each field (nested models expanded) is in the tables, under the variable pydantic reads."""
    text = DOC.read_text()
    variables = set(iter_variables())
    for cls in settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, info in cls.model_fields.items():
            nested = getattr(info.annotation, "model_fields", None)
            names = [f"{name}__{sub}" for sub in nested] if nested else [name]
            for full in names:
                assert f"`{full.replace('__', '.')}`" in text, (cls.__name__, full)
                if name not in ("redis_url", "admin_token", "service_token", "log_level"):
                    assert (prefix + full.upper()) in variables, (cls.__name__, full)


def test_the_command_prints_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings", "docs"]) == 0
    assert capsys.readouterr().out == DOC.read_text()

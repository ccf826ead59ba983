"""docs/settings.md, generated from the settings classes: every setting, its variable, its type,
its default and the comment written beside it in the class (so the table cannot drift from the code).

A trailing comment on a field's line is its description; a comment block on lines of its own
starts a new part of the table with that text above it. Nested models (the trainer's ``model``,
``loss``, ...) are expanded as ``model.hidden_size`` -> ``ROLLOUT_TRAIN_MODEL__HIDDEN_SIZE``.
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from services.runtime.settings import SHARED_FIELDS, RedisSettings, ServiceSettings, shared_variable

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
HEADER = """# Settings

Generated from the settings classes by `rollout settings docs --write` (do not edit by hand:
`tests/test_settings_doc.py` fails when this file is stale). Every setting is a field of one
pydantic-settings class per process, read from `ROLLOUT_<SERVICE>_<NAME>`; a command-line flag,
where there is one, wins over the variable. Sizes and times are in the units their names say.
"""


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    variable: str
    type: str
    default: str
    description: str


@dataclass(frozen=True, slots=True)
class Part:
    heading: str  # "" for the first part of a class
    rows: list[Row]


def settings_classes() -> list[type[BaseModel]]:
    """Every process's settings class, in the order the docs present them."""
    from services.engines.settings import EngineSettings
    from services.llm_proxy.settings import ProxySettings
    from services.rollout_api.dump import DumpSettings
    from services.rollout_api.settings import ApiSettings, WorkerSettings
    from services.sandbox_broker.settings import BrokerSettings
    from trainer_client.settings import TrainSettings

    return [ApiSettings, WorkerSettings, ProxySettings, BrokerSettings, EngineSettings, TrainSettings,
            DumpSettings, RedisSettings]  # fmt: skip


def render() -> str:
    out = [HEADER, _shared_section()]
    for cls in settings_classes():
        out.append(_class_section(cls))
    return "\n".join(out)


def _shared_section() -> str:
    lines = ["## Shared settings", "",
             "Resolved one way by every process (`services/runtime/settings.py`), highest first: the flag, the",
             "process's own `ROLLOUT_<SERVICE>_<NAME>`, the shared `ROLLOUT_<NAME>`, the default. An empty",
             "variable counts as unset. Each process's table below says which of them it reads.", "",
             "| setting | shared variable | type | default | description |", "|---|---|---|---|---|"]  # fmt: skip
    owners = {name: cls for cls in _shared_owners() for name in _own_fields(cls)}
    for name in SHARED_FIELDS:
        for part in _parts(owners[name], "", "", only=[name]):
            for row in part.rows:
                description = " ".join(filter(None, [part.heading, row.description]))
                lines.append(_row(Row(name, shared_variable(name), row.type, row.default, description)))
    return "\n".join(lines) + "\n"


def _shared_owners() -> list[type[BaseModel]]:
    from services.runtime.settings import UsesAdminToken, UsesRedis, UsesServiceToken

    return [ServiceSettings, UsesRedis, UsesAdminToken, UsesServiceToken]


def _class_section(cls: type[BaseModel]) -> str:
    prefix = str(cls.model_config.get("env_prefix", ""))
    doc = (inspect.getdoc(cls) or "").splitlines()[0]
    shared = [name for name in SHARED_FIELDS if name in cls.model_fields and prefix]
    lines = [f"## {cls.__name__} (`{prefix}*`)", "", doc, ""]
    if shared:
        lines += ["Shared settings it reads: " + ", ".join(f"`{n}`" for n in shared) + ".", ""]
    for part in _parts(cls, prefix, ""):
        if part.heading:
            lines += [part.heading[0].upper() + part.heading[1:] + ":", ""]
        lines += ["| setting | variable | type | default | description |", "|---|---|---|---|---|"]
        lines += [_row(row) for row in part.rows] + [""]
    return "\n".join(lines)


def _parts(cls: type[BaseModel], prefix: str, path: str, only: list[str] | None = None) -> list[Part]:
    """The class's own fields (and, expanded, its nested models'), cut where a comment block stands."""
    parts = [Part("", [])]
    for name, line in _own_fields(cls).items():
        if only is not None and name not in only:
            continue
        if only is None and name in SHARED_FIELDS:
            continue
        if line.heading:
            parts.append(Part(line.heading, []))
        info = cls.model_fields[name]
        nested = _nested_model(info.annotation)
        if nested is not None:
            for part in _parts(nested, prefix, f"{path}{name}."):
                parts[-1].rows.extend(part.rows)
            continue
        variable = (prefix + (path + name).replace(".", "__").upper()) if prefix else ""
        parts[-1].rows.append(Row(path + name, variable, line.type, _default(info), line.description))
    return [part for part in parts if part.rows]


@dataclass(frozen=True, slots=True)
class _Line:
    type: str
    description: str
    heading: str


def _own_fields(cls: type[BaseModel]) -> dict[str, _Line]:
    """Every field in ``cls``'s own body (inherited ones included, from the class that declares
    them), with its annotation and the comments around it, in declaration order."""
    found: dict[str, _Line] = {}
    for klass in reversed(cls.__mro__):
        if isinstance(klass, type) and issubclass(klass, BaseModel) and "__annotations__" in klass.__dict__:
            found.update({k: v for k, v in _source_fields(klass).items() if k in cls.model_fields})
    return {name: found[name] for name in cls.model_fields if name in found}


def _source_fields(klass: type) -> dict[str, _Line]:
    source = textwrap.dedent(inspect.getsource(klass))
    comments, code_lines = _comments(source)
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    fields: dict[str, _Line] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        trailing = " ".join(comments[n] for n in range(node.lineno, end + 1) if n in comments and n in code_lines)
        above: list[str] = []
        n = node.lineno - 1
        while n in comments and n not in code_lines:
            above.insert(0, comments[n])
            n -= 1
        block = " ".join(above)
        if _is_heading(block, trailing, blank_before=n not in code_lines, annotation=node.annotation):
            fields[node.target.id] = _Line(ast.unparse(node.annotation), trailing, block)
        else:
            fields[node.target.id] = _Line(ast.unparse(node.annotation), trailing or block, "")
    return fields


def _is_heading(block: str, trailing: str, *, blank_before: bool, annotation: ast.expr) -> bool:
    """A comment block above a field heads a part of the table, unless it is that field's own
    description: the field has no trailing comment, the block follows code directly and says more
    than a short title."""
    if not block:
        return False
    short_title = ":" not in block and len(block.split()) < 6
    nested = isinstance(annotation, ast.Name) and annotation.id.endswith("Config")
    return bool(trailing) or blank_before or short_title or nested


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """{line: comment text} and the lines that hold code."""
    comments: dict[int, str] = {}
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith("fmt:") and not text.startswith("type:"):
                comments[tok.start[0]] = text
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    return comments, code


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _default(info: Any) -> str:
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:
            return "(computed)"
        return f"`{value!r}`" if value in ({}, []) else "(computed at start)"
    if info.default is PydanticUndefined:
        return "(required)"
    value = info.default
    text = str(value) if isinstance(value, Path) else repr(value)
    return f"`{text}`"


def _row(row: Row) -> str:
    cells = [f"`{row.name}`", f"`{row.variable}`" if row.variable else "", f"`{row.type}`", row.default,
             row.description]  # fmt: skip
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def iter_variables() -> Iterator[str]:
    """Every environment variable the tables name (for the docs test)."""
    for cls in settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))
        for part in _parts(cls, prefix, ""):
            yield from (row.variable for row in part.rows)

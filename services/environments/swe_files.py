"""SWE instance files (``rollout tasks import swe FILE...``): JSONL (or a JSON array) of SWE-bench,
SWE-Gym, SWE-smith or R2E-Gym rows, each mapped by its format's module onto the SWE route's
instances, one ``POST /rollouts/swebench`` body per format. Every instance carries its ``source``
and ``source_version`` (given, else the file's content hash), which every trajectory records."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from services.environments import r2egym, swebench, swegym, swesmith
from services.protocol.swebench import SweBenchRolloutRequest, SweInstance

FORMATS: dict[str, ModuleType] = {"swebench": swebench, "swe-gym": swegym, "swe-smith": swesmith, "r2e-gym": r2egym}


class FormatError(ValueError):
    """A file or row this importer cannot map (the message names the file and row)."""


@dataclass
class Imported:
    """The route's request bodies, one per format, and what the rows held that is not carried."""

    requests: list[SweBenchRolloutRequest] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file, or of a file holding one JSON array."""
    text = path.read_text()
    rows: list[Any]
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(row, dict) for row in rows):
        raise FormatError(f"{path}: every row must be a JSON object")
    return rows


def detect(row: dict[str, Any]) -> str:
    """The format a row's field names say (SWE-Gym's are SWE-bench's: name it to get its images)."""
    if "docker_image" in row and "expected_output_json" in row:
        return "r2e-gym"
    if "image_name" in row and "patch" in row and "base_commit" not in row and "test_patch" not in row:
        return "swe-smith"
    if "base_commit" in row and "FAIL_TO_PASS" in row:
        return "swebench"
    raise FormatError(f"unknown row format (fields: {', '.join(sorted(row)[:12])}); pass --format")


def file_version(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def import_files(
    paths: list[Path], fmt: str = "auto", *, source_version: str | None = None, **options: Any
) -> Imported:
    """Map every row of ``paths``; ``options`` are the route's request options (``job`` at least)."""
    if fmt != "auto" and fmt not in FORMATS:
        raise FormatError(f"unknown format {fmt!r} (known: auto, {', '.join(FORMATS)})")
    found: dict[str, list[SweInstance]] = {}
    out = Imported()
    for path in paths:
        version = source_version or file_version(path)
        for number, row in enumerate(read_rows(path), 1):
            name = detect(row) if fmt == "auto" else fmt
            try:
                found.setdefault(name, []).append(FORMATS[name].instance(row, version))
            except ValueError as exc:
                raise FormatError(f"{path}:{number} ({name}): {exc}") from exc
            if name == "r2e-gym" and (skipped := r2egym.unscored(row)):
                out.notes.append(f"{path}:{number}: tests expected to end {sorted(set(skipped.values()))} are not "
                                 f"scored: {', '.join(sorted(skipped))}")  # fmt: skip
    for name, instances in found.items():
        defaults = FORMATS[name].request_defaults()
        setup = [*defaults.pop("setup", []), *options.get("setup", [])]
        body = {**defaults, **options, "setup": setup, "instances": instances}
        out.requests.append(SweBenchRolloutRequest.model_validate(body))
    return out
